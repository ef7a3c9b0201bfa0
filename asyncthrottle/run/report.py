"""The runner's report as data: the JSON of ``--json`` (schema 1)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..stats import Stats
from .advice import suggestions
from .sourceindex import site as named
from .steps import Source, Steps

__all__ = ["SCHEMA", "collect", "schema"]

SCHEMA = 1


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``--json``'s report, schema 1: the package's
    ``asyncthrottle/run/report.schema.json``, a new dict at each call. Validate a report with
    it, e.g. ``jsonschema.validate(report, schema())``."""
    text = resources.files("asyncthrottle.run").joinpath("report.schema.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def collect(steps: Steps, rows: Sequence[dict[str, Any]] | None, *, script: str, code: int,
            argv: Sequence[str], raised: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's data (``--json``'s schema 1) from what the run found. Reads the delivered
    host copies: call it once the sync audit has stopped. ``trace`` is None: the caller sets it
    (``{"path": ..., "written": ...}``) once it has written a trace. ``raised``: the script's
    uncaught exception (:func:`~.raised.raised`), the report's ``raised`` (None: left out)."""
    source = _main(steps.sources)
    stats = _grouped(source)
    count = stats.steps if stats is not None else 0
    wall = stats.wall_s if stats is not None else 0.0
    verdict = stats.verdict if stats is not None else "unknown"
    advice = stats.advice if stats is not None else ""
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "script": script,
        "argv": list(argv),
        "exit_code": code,
        "steps": count,
        "steps_per_s": stats.steps_per_s if stats is not None else 0.0,
        **_series(source.series() if source is not None else [], count),
        "syncs": _syncs(rows, steps.tail_reads, count) if rows is not None else None,
        "verdict": verdict,
        "advice": advice,
        "sections": dict(stats.sections or {}) if stats is not None else {},
        "input_wait_s": steps.input_wait,
        "input_wait_fraction": steps.input_wait / wall if wall > 0 else 0.0,
        "loader": steps.loader,
        "framework": source.framework if source is not None else None,
        "error": repr(steps.error) if steps.error is not None else None,
        "stats": _plain(stats.as_dict()) if stats is not None else {},
        # with "jax" where the script imported JAX (the session says so)
        "seen": dict(steps.seen),
        "trace": None,
    }
    if raised is not None:
        data["raised"] = raised
    timed = source.per_step() if source is not None else None
    if timed is not None:
        data["per_step"] = timed
    several = source.by_optimizer() if source is not None else {}
    if several:
        each = {name: _series(values, count) for name, values in several.items()}
        data["losses_by_optimizer"] = {name: found.pop("losses") for name, found in each.items()}
        data["nonfinite_by_optimizer"] = each
    if source is not None:
        data["synchronous"] = source.hooks.throttle.synchronous
    data["suggestions"] = suggestions(data, synchronous=data.get("synchronous") is not False)
    return _plain(data)  # type: ignore[no-any-return]


def _main(sources: Sequence[Source]) -> Source | None:
    """The throttle that saw the most steps (the runner's, or a framework's callback)."""
    if not sources:
        return None
    return max(sources, key=lambda source: source.steps)


def _grouped(source: Source | None) -> Stats | None:
    """The throttle's stats, counting the report's steps (:meth:`Source.regroup`), not the
    live ones."""
    if source is None:
        return None
    stats = source.hooks.throttle.stats
    count = source.steps
    if count == stats.steps:
        return stats
    completed = max(0, stats.completed - (stats.steps - count))
    return dataclasses.replace(stats, steps=count, completed=completed,
                               in_flight=count - completed,
                               steps_per_s=count / stats.wall_s if stats.wall_s > 0 else 0.0)


def _series(series: Sequence[float | None], count: int) -> dict[str, Any]:
    """One loss series by step (``count`` steps): ``losses`` (None: none delivered, or NaN/Inf),
    ``nonfinite`` (the NaN/Inf steps) and ``last_nonfinite`` (the last delivered loss as
    ``"nan"``, ``"inf"`` or ``"-inf"`` when it is not finite, else None)."""
    values = [_float(v) for v in list(series[:count]) + [None] * (count - len(series))]
    delivered = [v for v in values if v is not None]
    last = delivered[-1] if delivered else None
    return {"losses": [v if v is not None and math.isfinite(v) else None for v in values],
            "nonfinite": [step for step, v in enumerate(values)
                          if v is not None and not math.isfinite(v)],
            "last_nonfinite": None if last is None or math.isfinite(last) else str(last)}


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _syncs(rows: Sequence[dict[str, Any]], tail: Sequence[dict[str, Any]],
           steps: int) -> list[dict[str, Any]]:
    """The audit's rows, sorted by count per step, with the sites read only after the last step's
    update (no step followed: after the script's loop) moved out of the steps. ``file``: the
    site's file (absolute; None where the audit did not give it); ``blocked_s``: the seconds
    the row's timed reads blocked (None: none timed), ``blocked_per_step_s`` that a step;
    ``function`` and ``text``: the function around the site and its line's text, which tell
    ``compare`` the read after an edit moved its line (:func:`~.sourceindex.site`)."""
    counts: dict[tuple[str, str, str | None, bool], int] = {}
    blocked: dict[tuple[str, str, str | None, bool], float] = {}
    files: dict[str, str | None] = {}
    # the f-string fields a site's Tensor.__format__ reads formatted
    fields: dict[str, list[int]] = {}
    for row in rows:
        key = (row["site"], row["call"], row.get("via"), bool(row["in_step"]))
        counts[key] = counts.get(key, 0) + row["count"]
        _add_blocked(blocked, key, row.get("blocked_s"))
        files[row["site"]] = files.get(row["site"]) or row.get("file")
        if row.get("fields"):
            fields[row["site"]] = row["fields"]
    for row in tail:
        inside = (row["site"], row["call"], row.get("via"), True)
        outside = (*inside[:3], False)
        # a site read in earlier steps too is the loop's own line: it stays in the steps
        if counts.get(inside, 0) == row["count"]:
            counts[inside] = 0
            counts[outside] = counts.get(outside, 0) + row["count"]
            _add_blocked(blocked, outside, blocked.pop(inside, None))
    out: list[dict[str, Any]] = []
    for (site, call, via, in_step), count in counts.items():
        seconds = blocked.get((site, call, via, in_step))
        if count > 0:
            out.append({"site": site, "call": call, "count": count,
                        "per_step": count / steps if steps else 0.0, "in_step": in_step,
                        "via": via, "file": files.get(site), "blocked_s": seconds,
                        "blocked_per_step_s": seconds / steps if seconds is not None and steps
                        else None, **named(files.get(site), site)})
            if call == "Tensor.__format__" and site in fields:
                out[-1]["fields"] = fields[site]
    return sorted(out, key=lambda row: (-row["per_step"], row["site"], row["via"] or ""))


def _add_blocked(blocked: dict[Any, float], key: Any, seconds: float | None) -> None:
    """``seconds`` blocked (None: not timed) added to ``key``'s."""
    if seconds is not None:
        blocked[key] = blocked.get(key, 0.0) + seconds


def _plain(value: Any) -> Any:
    """``value`` for JSON: NaN and Inf as None, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
