"""The noise in a run's speed that its own step times show: how far apart two runs' steps/s may
be by chance (``compare`` says a difference within it is within the noise, not "4% slower").

One run cannot show the noise between runs; what it shows is how its speed drifts within itself.
Its timed steps are cut into up to :data:`BLOCKS` runs of consecutive steps, and the spread of
the blocks' mean step times (batch means: steps next to each other are alike, so single steps
understate it) gives the uncertainty of the run's mean step time. The spread is the blocks'
median absolute deviation, so that a warm-up, the same in both runs, is not taken for noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["BLOCKS", "noise", "relative_noise"]

# the most blocks a run's steps are cut into, the fewest that give a spread
BLOCKS, _FEWEST = 10, 3
# a standard deviation from a median absolute deviation (of a normal spread)
_MAD_SD = 1.4826
# the noise is this many standard errors of the ratio (about 95 % of differences by chance)
_ERRORS = 2.0


def relative_noise(step_s: Sequence[float | None] | None) -> float | None:
    """The standard error of a run's mean step time as a fraction of it, from its steps' times
    (None where not timed) by :data:`BLOCKS` blocks of consecutive steps; None: fewer than
    ``2 * 3`` timed steps, or none that took any time."""
    timed = [float(t) for t in step_s or () if t is not None and math.isfinite(t) and t >= 0]
    blocks = min(BLOCKS, len(timed) // 2)
    if blocks < _FEWEST:
        return None
    size = len(timed) / blocks
    means = [statistics.fmean(timed[round(k * size):round((k + 1) * size)])
             for k in range(blocks)]
    typical = statistics.median(means)
    if typical <= 0:
        return None
    spread = _MAD_SD * statistics.median(abs(m - typical) for m in means)
    return spread / math.sqrt(blocks) / typical


def noise(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Compare's ``speed_noise`` for two run reports: ``pct``, the speed difference in percent
    that chance alone reaches (two standard errors of the ratio of their speeds), ``within``
    (whether AFTER's difference from BEFORE is no larger), each report's ``before_pct`` and
    ``after_pct`` (one standard error of its mean step time); None where a report has too few
    per-step times (``per_step.step_s``) or BEFORE no speed."""
    each = [relative_noise((report.get("per_step") or {}).get("step_s"))
            for report in (before, after)]
    old, new = before["steps_per_s"], after["steps_per_s"]
    if each[0] is None or each[1] is None or not old > 0:
        return None
    pct = _ERRORS * math.hypot(each[0], each[1]) * 100
    return {"pct": pct, "within": abs(new / old - 1) * 100 <= pct,
            "before_pct": each[0] * 100, "after_pct": each[1] * 100}
