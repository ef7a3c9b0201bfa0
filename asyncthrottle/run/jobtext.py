"""The job's lines of the printed report: each rank, the straggler, the ranks that never reported,
and the script's collectives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["collective_lines", "job_lines", "ranks_of"]

# the phases of a rank's row, in a step's order
_PHASES = ("forward", "backward", "optimizer", "input")


def job_lines(data: dict[str, Any]) -> list[str]:
    """The ranks' table, the straggler (or that the ranks are even) and the missing ranks."""
    rows = data["ranks"]
    lines = [f"  ranks ({data['world_size']}; median per step in ms; "
             f"{'/'.join(_PHASES)}):"]
    for row in rows:
        step = row["step_s_median"]
        phases = " / ".join(_ms(row["sections"].get(name)) for name in _PHASES)
        ended = "" if row["exit_code"] == 0 else f"  exit code {row['exit_code']}"
        lines.append(f"    rank {row['rank']} on {row['host']}: {row['steps']} steps, "
                     f"{row['steps_per_s']:.3g} steps/s, step {_ms(step * 1000 if step else None)}"
                     f" ms; {phases}; input wait {row['input_wait_fraction']:.0%}{ended}")
    lines += [f"    rank {gone['rank']}: no report: {gone['ended']}"
              for gone in data["missing_ranks"]]
    return [*lines, _straggler(data)]


def _straggler(data: dict[str, Any]) -> str:
    found = data["straggler"]
    if found is None:
        return ("  straggler: none (the ranks are even: no rank's own work a step exceeds the "
                "others' by 10% of the step)")
    return (f"  straggler: rank {found['rank']}, slow in its {found['phase']}; the other ranks "
            f"wait for it {found['cost_fraction']:.0%} of the job's step time")


def collective_lines(rows: Sequence[dict[str, Any]] | None) -> list[str]:
    """The script's collectives: one line a site and call."""
    if rows is None:
        return []
    if not rows:
        return ["  collectives: none called by the script (DDP's own are in the backward)"]
    lines = ["  collectives (the script's: site, call, count, per step, time blocked):"]
    for row in rows:
        where = "in steps" if row["in_step"] else "outside steps"
        logged = ", only logged" if row.get("only_logged") else ""
        call = row["call"] + (f" (in {row['via']})" if row.get("via") else "")
        lines.append(f"    {row['site']}  {call}  {row['count']}  "
                     f"{row['per_step']:.2f}  {row['blocked_s'] * 1000:.3g} ms  {where}{logged}"
                     f"{ranks_of(row)}")
    return lines


def ranks_of(row: dict[str, Any]) -> str:
    """`` (ranks 0, 2 only)`` where a merged row's site is reached by only some ranks."""
    counts = row.get("ranks")
    if not counts or all(counts):
        return ""
    return f"  (ranks {', '.join(str(r) for r, n in enumerate(counts) if n)} only)"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
