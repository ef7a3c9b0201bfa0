"""The job's report from its ranks' reports: each rank's figures, the straggler, and the sync
sites and collectives merged across ranks."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .guard import NOT_COUNTED, judge

__all__ = ["EVEN", "PHASES", "merge", "rank_row", "straggler"]

# the phases a straggler is named by; the backward is not one: in DDP it holds the gradients'
# all-reduce, where the other ranks wait for the slow one (its own backward looks the shortest)
PHASES = ("forward", "optimizer", "input")
# ranks are even when the slowest rank's own work a step (forward, optimizer, input wait) exceeds
# the others' median by less than this share of the job's step time
EVEN = 0.10


def rank_row(rank: int, report: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's row of the job's ``ranks``: ``sections`` are its medians a step in ms, with
    ``input``: its input wait a step."""
    steps = report["steps"]
    sections = {name: ms for name, ms in report["sections"].items() if ms is not None}
    sections["input"] = report["input_wait_s"] / steps * 1000 if steps else 0.0
    return {"rank": rank, "host": report.get("host"), "steps": steps,
            "steps_per_s": report["steps_per_s"], "step_s_median": _median_step(report),
            "input_wait_fraction": report["input_wait_fraction"], "sections": sections,
            "exit_code": report["exit_code"]}


def _median_step(report: Mapping[str, Any]) -> float | None:
    """The rank's median step time in seconds (None: no step)."""
    timed = (report.get("per_step") or {}).get("step_s")
    if timed:
        return float(statistics.median(timed))
    rate = report["steps_per_s"]
    return 1 / rate if rate else None


def straggler(rows: Sequence[Mapping[str, Any]], even: float = EVEN) -> dict[str, Any] | None:
    """The rank that holds the job back: the one whose own work a step (its :data:`PHASES`) is
    the most; ``phase``: where it exceeds the other ranks' median the most; ``cost_fraction``:
    what it costs the others, their mean wait a step (its own work less theirs) over the job's
    step time (the slowest rank's median). None with fewer than two ranks with steps, or when
    the ranks are even (:data:`EVEN`)."""
    timed = [row for row in rows if row["steps"] and row["step_s_median"]]
    if len(timed) < 2:
        return None
    own = {row["rank"]: sum(row["sections"].get(p, 0.0) for p in PHASES) for row in timed}
    slow = max(timed, key=lambda row: own[row["rank"]])
    others = [row for row in timed if row is not slow]
    step_ms = max(row["step_s_median"] for row in timed) * 1000
    excess = own[slow["rank"]] - statistics.median(own[row["rank"]] for row in others)
    if excess < even * step_ms:
        return None
    phase = max(PHASES, key=lambda p: slow["sections"].get(p, 0.0) - statistics.median(
        row["sections"].get(p, 0.0) for row in others))
    waits = [own[slow["rank"]] - own[row["rank"]] for row in others]
    return {"rank": slow["rank"], "phase": phase,
            "cost_fraction": min(1.0, statistics.fmean(waits) / step_ms)}


def merge(reports: Mapping[int, dict[str, Any]], missing: Mapping[int, str], world: int,
          limit: float | None) -> dict[str, Any]:
    """The job's report: rank 0's (or the lowest rank's that reported) with ``world_size``,
    ``ranks``, ``missing_ranks``, ``straggler``, its ``syncs`` and ``collectives`` merged across
    the ranks (:func:`merge_rows`) and ``--max-syncs-per-step`` judged on every rank."""
    order = sorted(reports)
    data = dict(reports[order[0]])
    rows = [rank_row(rank, reports[rank]) for rank in order]
    data.update({"world_size": world, "ranks": rows, "straggler": straggler(rows),
                 "missing_ranks": [{"rank": rank, "ended": why} for rank, why in missing.items()]})
    for key in ("syncs", "collectives"):
        each = {rank: reports[rank].get(key) for rank in order}
        data[key] = None if any(v is None for v in each.values()) else merge_rows(
            {rank: rows or [] for rank, rows in each.items()}, world)
    data.update(_guard(data, reports, limit, missing))
    return data


def merge_rows(each: Mapping[int, Sequence[Mapping[str, Any]]],
               world: int) -> list[dict[str, Any]]:
    """One row a site, call, ``via`` and in/out of steps across the ranks: ``ranks``, its count on
    each rank (0: a rank that never reached it, or never reported); ``count`` and ``blocked_s``
    the ranks' sums; ``per_step`` and ``blocked_per_step_s`` the highest rank's."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rank, rows in each.items():
        for row in rows:
            key = (row["site"], row["call"], row.get("via"), row["in_step"])
            into = merged.setdefault(key, {**row, "count": 0, "per_step": 0.0, "blocked_s": None,
                                           "blocked_per_step_s": None, "ranks": [0] * world})
            into["ranks"][rank] += row["count"]
            into["count"] += row["count"]
            into["per_step"] = max(into["per_step"], row["per_step"])
            _add(into, row, "blocked_s", sum)
            _add(into, row, "blocked_per_step_s", max)
            if "only_logged" in row:
                into["only_logged"] = into.get("only_logged", True) and row["only_logged"]
    return sorted(merged.values(), key=lambda row: (-row["per_step"], row["site"],
                                                    row.get("via") or ""))


def _add(into: dict[str, Any], row: Mapping[str, Any], key: str, how: Any) -> None:
    if row.get(key) is not None:
        into[key] = row[key] if into[key] is None else how((into[key], row[key]))


def _guard(data: dict[str, Any], reports: Mapping[int, dict[str, Any]], limit: float | None,
           missing: Mapping[int, str]) -> dict[str, Any]:
    """``--max-syncs-per-step`` on every rank: a merged row fails where its highest rank's reads
    a step are over the limit; a rank with no step fails as ``no_steps``, a rank that never
    reported as ``not_counted``."""
    fields = judge({**data, "steps": min(r["steps"] for r in reports.values())}, limit)
    if limit is not None and missing and fields["guard"] != "over_limit":
        fields["guard"] = NOT_COUNTED
    return fields
