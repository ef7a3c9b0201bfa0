"""Which sync sites of two run reports are one read, across an edit of the script: matched by what
they are (file, call, ``via``, ``in_step``, the enclosing function and the line's text), the line
number only breaking ties, so that lines inserted above a read do not make it another one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["match"]

Row = dict[str, Any]
# a site's identity: file, call, via, in_step (and, where both reports carry them, the enclosing
# function and the line's text)
Identity = tuple[Any, ...]
# the changes of one site and call, in the table's order
_KINDS = ("removed", "added", "moved?", "changed")


def match(old: Sequence[Row], new: Sequence[Row]) -> dict[str, Any]:
    """The ``syncs`` of a comparison: ``changes`` (``removed``, ``added``, ``changed``, and for
    reports without the lines' text ``moved?``), ``unchanged`` (how many reads are the same) and
    ``moved`` (of those, the ones at another line: ``{"call", "via", "in_step", "before",
    "after"}``, the two sites).

    Where every row of both reports carries ``text`` (reports since #56), reads of one identity
    pair in line order, whatever their lines: a read whose identity holds known text is the
    same read at another line. Otherwise (an older report) only its site tells a read: the same
    site pairs, and the only gone and the only new site of a file, call, ``via`` and ``in_step``
    pair as ``moved?`` (most likely, not certainly, one read at a moved line)."""
    full = all("text" in row for row in (*old, *new))
    olds, news = _grouped(old, full), _grouped(new, full)
    changes: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    unchanged = 0
    for identity in dict.fromkeys([*olds, *news]):
        was, now = olds.get(identity, []), news.get(identity, [])
        sure = full and identity[-1] is not None
        pairs, gone, came = _paired(was, now, sure)
        for before, after, kind in pairs:
            if kind == "moved?" or not _same_rate(before, after):
                changes.append(_change(kind if kind == "moved?" else "changed", before, after))
                continue
            unchanged += 1
            if before["site"] != after["site"]:
                moved.append({"call": before["call"], "via": before.get("via"),
                              "in_step": bool(before["in_step"]), "before": before["site"],
                              "after": after["site"]})
        changes += [_change("removed", row, None) for row in gone]
        changes += [_change("added", None, row) for row in came]
    changes.sort(key=lambda c: (not c["in_step"], -max(_rate(c["before"]), _rate(c["after"])),
                                _site(c), c["call"], _KINDS.index(c["change"])))
    moved.sort(key=lambda m: (m["before"].rpartition(":")[0], _line({"site": m["before"]})))
    return {"changes": changes, "unchanged": unchanged, "moved": moved}


def _grouped(rows: Sequence[Row], full: bool) -> dict[Identity, list[Row]]:
    """The rows by identity, each group in line order."""
    groups: dict[Identity, list[Row]] = {}
    for row in rows:
        file = row["site"].rpartition(":")[0]
        identity: Identity = (file, row["call"], row.get("via"), bool(row["in_step"]))
        if full:
            text = row["text"]
            identity += (row.get("function"), " ".join(text.split()) if text else text)
        groups.setdefault(identity, []).append(row)
    for group in groups.values():
        group.sort(key=_line)
    return groups


def _paired(was: list[Row], now: list[Row], sure: bool
            ) -> tuple[list[tuple[Row, Row, str]], list[Row], list[Row]]:
    """The pairs (before, after, ``"same"`` or ``"moved?"``) of one identity's rows, and the rows
    left gone and new. ``sure``: pair in line order; else the same site, then the only two
    left."""
    if sure:
        count = min(len(was), len(now))
        return ([(a, b, "same") for a, b in zip(was[:count], now[:count], strict=True)],
                was[count:], now[count:])
    sites = {row["site"]: row for row in now}
    pairs = [(row, sites[row["site"]], "same") for row in was if row["site"] in sites]
    kept = {row["site"] for row in was if row["site"] in sites}
    gone = [row for row in was if row["site"] not in kept]
    came = [row for row in now if row["site"] not in kept]
    if len(gone) == len(came) == 1:
        return [*pairs, (gone[0], came[0], "moved?")], [], []
    return pairs, gone, came


def _same_rate(before: Row, after: Row) -> bool:
    return bool(before["count"] == after["count"]
                and math.isclose(before["per_step"], after["per_step"], abs_tol=1e-12))


def _line(row: Row) -> int:
    number = row["site"].rpartition(":")[2]
    return int(number) if number.isdigit() else 0


def _figures(row: Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"site": row["site"], "count": row["count"], "per_step": row["per_step"]}


def _change(change: str, old: Row | None, new: Row | None) -> dict[str, Any]:
    row = old if old is not None else new
    assert row is not None
    return {"change": change, "call": row["call"], "via": row.get("via"),
            "in_step": bool(row["in_step"]), "before": _figures(old), "after": _figures(new)}


def _rate(figures: dict[str, Any] | None) -> float:
    return float(figures["per_step"]) if figures is not None else 0.0


def _site(change: dict[str, Any]) -> str:
    return str((change["before"] or change["after"])["site"])
