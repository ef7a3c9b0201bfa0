"""``run --max-syncs-per-step N``: a CI check that fails when a line of the training steps reads
device values on the host more than N times a step, on a machine with no GPU too."""

from __future__ import annotations

from typing import Any

__all__ = ["GUARD_EXIT", "exit_code", "judge"]

# run's exit code when the guard fails and the script itself exited 0 (python exits 0, 1 for an
# uncaught exception, 2 for a usage error or a script it cannot open, 120 when it cannot flush)
GUARD_EXIT = 3
# the guard's outcomes: no site over the limit; sites over it; no step found, or no reads
# counted: nothing to judge (it fails: a CI check that cannot see the steps must not pass)
PASSED, OVER_LIMIT, NO_STEPS, NOT_COUNTED = "passed", "over_limit", "no_steps", "not_counted"


def judge(data: dict[str, Any], limit: float | None) -> dict[str, Any]:
    """The report's guard fields, from its ``steps`` and ``syncs``:

    - ``max_syncs_per_step``: the limit (None without the option);
    - ``over_limit``: the ``syncs`` rows read in steps more than ``limit`` times a step on
      average (``in_step`` and ``per_step > limit``), the most first ([] where nothing could be
      judged; None without the option);
    - ``guard``: ``"passed"``, ``"over_limit"``, ``"no_steps"`` (no training step found: syncs
      per step cannot be judged), ``"not_counted"`` (the reads were not counted), or None
      without the option. All but ``"passed"`` fail.
    """
    if limit is None:
        return {"max_syncs_per_step": None, "over_limit": None, "guard": None}
    syncs = data.get("syncs")
    over = [row for row in syncs or () if row["in_step"] and row["per_step"] > limit]
    over.sort(key=lambda row: -row["per_step"])
    if not data.get("steps"):
        outcome, over = NO_STEPS, []
    elif syncs is None:
        outcome = NOT_COUNTED
    else:
        outcome = OVER_LIMIT if over else PASSED
    return {"max_syncs_per_step": limit, "over_limit": over, "guard": outcome}


def exit_code(code: int, data: dict[str, Any]) -> int:
    """run's exit code: the script's ``code``, or :data:`GUARD_EXIT` where the script exited 0
    and the guard failed (a script that failed keeps its own code)."""
    failed = data.get("guard") not in (None, PASSED)
    return GUARD_EXIT if code == 0 and failed else code
