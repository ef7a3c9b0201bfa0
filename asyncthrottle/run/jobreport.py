"""A torchrun job's one report: each rank posts its own to the job's store, rank 0 gathers them,
prints the job's and writes its files; the other ranks say only what went wrong on them."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from .collectives import Collectives
from .guard import PASSED, exit_code
from .html import render as page
from .job import Job, gather
from .jobmerge import merge
from .outputs import suggest, write
from .script import Ending, say
from .sigterm import Terminated
from .steps import Steps
from .text import text

__all__ = ["collective_advice", "report_job", "trouble"]


def report_job(job: Job, data: dict[str, Any], steps: Steps, collectives: Collectives | None,
               options: Any, root: str, ending: Ending, terminated: Terminated, *,
               flush: bool = True) -> int:
    """Post this rank's report; on rank 0, wait for the others' (``options.ranks_timeout``, cut
    short once torchrun's SIGTERM came: ``terminated``), then print and write the job's
    (``flush``: the script's stdout first). Returns run's exit code: rank 0's from the job's
    guard, each other rank's from its own."""
    terminated.reporting = True
    try:
        return _report(job, data, steps, collectives, options, root, ending, terminated, flush)
    finally:
        terminated.close()


def _report(job: Job, data: dict[str, Any], steps: Steps, collectives: Collectives | None,
            options: Any, root: str, ending: Ending, terminated: Terminated, flush: bool) -> int:
    main = max(steps.sources, key=lambda s: s.steps, default=None)
    count = main.steps if main is not None else 0
    data["host"] = job.host
    data["collectives"] = collectives.rows(count) if collectives is not None else []
    posted = {**data, "trace_events": _events(main) if options.trace else None}
    try:
        job.post(posted)
    except Exception as exc:
        say(f"asyncthrottle run (rank {job.rank} of {job.world}): its report could not reach "
            f"rank 0 through the job's store ({exc})\n")
        say(text(data, rank=(job.rank, job.world)) + "\n")
        return exit_code(ending.exit(), data)
    if job.rank != 0:
        for line in trouble(data, exit_code(ending.code, data), job):
            say(line + "\n")
        return exit_code(ending.exit(), data)
    merged = _gathered(job, options, root, terminated, flush)
    return exit_code(ending.exit(), merged)


def _gathered(job: Job, options: Any, root: str, terminated: Terminated,
              flush: bool) -> dict[str, Any]:
    """Rank 0: gather, merge, write and print the job's report; returns it."""
    reports, missing = gather(job, options.ranks_timeout, stop=terminated.over)
    events = {rank: report.pop("trace_events", None) for rank, report in reports.items()}
    data = merge(reports, missing, job.world, options.max_syncs_per_step)
    data["suggestions"] = list(data["suggestions"]) + collective_advice(data["collectives"] or [])
    data["trace"] = _trace(options.trace, events, data["ranks"])
    patch = suggest(data, root)
    write("--suggest", options.suggest, lambda: patch)
    write("--json", options.json, lambda: json.dumps(data, indent=1) + "\n")
    write("--html", options.html, lambda: page(data))
    try:
        if flush:
            sys.stdout.flush()
    except Exception:
        pass
    say(text(data) + "\n")
    return data


def trouble(data: dict[str, Any], code: int, job: Job) -> list[str]:
    """A rank's own lines, where something went wrong on it (its report is in rank 0's)."""
    who = f"asyncthrottle run (rank {job.rank} of {job.world} on {job.host})"
    lines = []
    raised = data.get("raised")
    if raised:
        site = f" at {raised['site']}" if raised.get("site") else ""
        lines.append(f"{who}: the script raised {raised.get('type') or 'an exception'}{site}")
    if data["error"] is not None:
        lines.append(f"{who}: the runner stopped finding steps after its own error: "
                     f"{data['error']}")
    if data["steps"] == 0 and not raised:
        lines.append(f"{who}: no training step found")
    if data.get("guard") not in (None, PASSED):
        lines.append(f"{who}: --max-syncs-per-step {data['max_syncs_per_step']:g} failed on "
                     f"this rank ({data['guard']})")
    if code != 0 and not lines:
        lines.append(f"{who}: exit code {code}")
    return [f"{line}; the job's report is rank 0's" for line in lines]


def collective_advice(rows: list[dict[str, Any]]) -> list[str]:
    """A suggestion for each collective the steps run every step only for a log: reduce it once
    per log window."""
    return [f"{row['site']} {row['call']} runs {_often(row['per_step'])} on every rank "
            f"({row['count']} calls in all) and its result is only logged: reduce it once per log "
            "window (keep the local value each step, and call "
            f"{row['call']} on it only in the step that logs)"
            for row in rows if row.get("only_logged") and row["in_step"]
            and row["per_step"] >= 0.5]


def _often(per_step: float) -> str:
    return "every step" if per_step == 1 else f"{per_step:.2g} times a step"


def _events(main: Any) -> list[dict[str, Any]] | None:
    """This rank's trace events (None: no step to trace)."""
    if main is None or main.hooks.throttle.stats.steps == 0:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        main.hooks.throttle.export_trace(path)
        with open(path, encoding="utf-8") as file:
            events: list[dict[str, Any]] = json.load(file)["traceEvents"]
    return events


def _trace(path: str | None, events: dict[int, list[dict[str, Any]] | None],
           ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Write ``--trace``: every rank's timeline, one process a rank (each from its own first
    step: the ranks' clocks are not one); the report's ``trace``."""
    if path is None:
        return None
    hosts = {row["rank"]: row["host"] for row in ranks}
    merged = []
    for rank, found in sorted(events.items()):
        for event in found or ():
            event = {**event, "pid": rank}
            if event.get("name") == "process_name":
                event["args"] = {"name": f"rank {rank} ({hosts.get(rank)})"}
            merged.append(event)
    if not merged:
        return {"path": path, "written": False}
    doc = {"traceEvents": merged, "displayTimeUnit": "ms"}
    try:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(doc, file)
    except OSError as exc:
        say(f"python -m asyncthrottle run: --trace {path!r} could not be written ({exc})\n")
        return {"path": path, "written": False}
    return {"path": path, "written": True}
