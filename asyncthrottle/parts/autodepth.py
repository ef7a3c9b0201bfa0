"""``depth="auto"`` (``AutoDepth``): watch for the device running dry inside the loop body, and
raise the depth when it does.

The core notes, as each step is recorded, whether the step before it -- still
unfinished when this step was handed out -- has already completed: the device
then drained its queue while the host was in the loop body, so it ran dry
there, out of sight of the hand-out's starved count (``Core.dry``). The
verdict reads that count; :class:`DepthController` hears each dry body
(``on_dry``) and raises the depth by one when the device keeps running dry
although the host also waits on it. Like tf.data's prefetch autotuner, it
starts small, only grows, and checks the memory budget before each increase.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import DEFAULT_MAX_DEPTH, AutoDepth, Option, check_int
from ._build import Part
from .memory import MemoryGate

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

_log = logging.getLogger("asyncthrottle")

# the depth auto starts at (FSDP's and MaxText's fixed choice)
AUTO_START = 2
# dry bodies, each after a wait, that it takes to raise the depth by one
_STRIKES = 2
# steps within which those strikes must fall (a rare hiccup never adds up)
_WINDOW = 64


def _flat_changes(changes: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    # how many times depth='auto' raised the depth
    return {"depth_changes": max(0, len(changes) - 1)}


@dataclasses.dataclass(frozen=True)
class AutoDepthStats:
    """The field of :class:`~asyncthrottle.Stats` that ``depth="auto"`` supplies."""

    depth_changes: tuple[tuple[int, int], ...] = dataclasses.field(
        default=(), metadata={"flat": _flat_changes}
    )


class DepthController(Part):
    """A part that finds the depth a loop needs: starts at 2, raises it by one when the device runs
    dry.

    A *strike* is a dry loop body (``Core.dry``) of a step handed
    out with the queue full (``depth - 1`` steps in flight: the depth was the
    bound), after the host has waited on the device at least once since the
    previous dry body: the host both waits for the device and lets it run
    dry, which a deeper queue fixes (a sync inside the body, which a deeper
    queue cannot fix, keeps the queue short and makes no strikes). Two
    strikes within 64 steps raise the depth by one, never above
    ``max_depth``, never while the memory budget has held the host back
    since the last change (then memory, not depth, is the bound), and never
    when the budget's readings at hand-outs, extrapolated by one more step,
    say the deeper queue would not fit (:meth:`MemoryGate.room_for`). The depth
    never shrinks. Waits in ``drain()`` are not counted. Deterministic: it
    reads only the core's counters and event queries.

    Args:
        core: the throttle's core; its depth is set to ``min(2, max_depth)`` now.
        max_depth: the highest depth it may choose.
        budget: the memory budget part, if any.

    Attributes:
        changes: ``(step, depth)`` for the start and every change: the depth
            applies from the hand-out of ``step`` on.
    """

    PLACE = 40
    OPTIONS = (
        Option("max_depth", "int | None", None, "`depth=\"auto\"`'s cap", "",
               functools.partial(check_int, minimum=1,
                                 rule="an int >= 1 (the deepest depth='auto' may go) or None",
                                 fix=f"e.g. depth=AutoDepth(max=16); None means "
                                     f"{DEFAULT_MAX_DEPTH}"),
               wrong_type=(2.5,), wrong_value=(4,), deprecated="`depth=at.AutoDepth(max=8)`",
               help='deprecated (it goes in 0.5): ``depth=AutoDepth(max=...)``.'),
    )
    STATS = AutoDepthStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        """``max_depth=`` (before 0.4; goes in 0.5): ``depth="auto"``'s cap, now
        ``depth=AutoDepth(max=...)``; with another depth, or with an ``AutoDepth``, it is a
        ``ValueError``."""
        depth, max_depth = options["depth"], options["max_depth"]
        if max_depth is None:
            return
        if isinstance(depth, AutoDepth):
            raise ValueError(f"max_depth={max_depth!r} and depth={depth!r} both set the cap; drop "
                             "max_depth")
        if depth != "auto":
            raise ValueError(
                f"max_depth={max_depth!r} applies to depth='auto' only, but depth={depth!r}; "
                "drop max_depth, or pass depth=asyncthrottle.AutoDepth(max=...)"
            )
        warn_at_user(f"max_depth={max_depth!r} is deprecated (it goes in 0.5): pass "
                     f"depth=asyncthrottle.AutoDepth(max={max_depth!r})", DeprecationWarning)

    @classmethod
    def build(cls, at: Build) -> DepthController | None:
        depth, max_depth = at.options["depth"], at.options["max_depth"]
        if depth == "auto":
            depth = AutoDepth() if max_depth is None else AutoDepth(max=max_depth)
        if not isinstance(depth, AutoDepth):
            return None
        return cls(at.core, depth.max, at.part(MemoryGate))

    def fields(self) -> dict[str, Any]:
        return {"depth_changes": tuple(self.changes)}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if not stats.depth_changes:
            return []
        path = " -> ".join(f"{depth} (step {step})" for step, depth in stats.depth_changes)
        return [f"  depth: auto, {path}; device ran dry in {stats.dry_fraction:.0%} of loop bodies"]

    def __init__(self, core: Core, max_depth: int, budget: MemoryGate | None = None) -> None:
        self.core, self.max_depth, self.budget = core, max_depth, budget
        start = min(AUTO_START, max_depth)
        core.set_depth(start)
        self.changes: list[tuple[int, int]] = [(core.steps, start)]
        # the host waited since the last dry body
        self._waited = False
        # the last step handed out with the queue full
        self._full = -1
        # steps of recent strikes since the last change
        self._strikes: list[int] = []
        self._budget_waits = budget.waits if budget is not None else 0

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        if not self.core.draining:
            self._waited = True

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        depth = self.core.depth
        if depth is not None and in_flight >= depth - 1:
            self._full = step

    def on_dry(self, step: int) -> None:
        """The device ran dry during ``step``'s body."""
        waited, self._waited = self._waited, False
        depth = self.core.depth
        if not waited or self._full != step or depth is None or depth >= self.max_depth:
            return
        strikes = [s for s in self._strikes if step - s < _WINDOW]
        strikes.append(step)
        self._strikes = strikes
        if len(strikes) < _STRIKES:
            return
        budget = self.budget
        if budget is not None and (budget.waits > self._budget_waits or not budget.room_for(depth)):
            # memory is (or would be) the bound: do not go deeper
            self._budget_waits = budget.waits
            self._strikes = []
            return
        self._raise(step + 1, depth + 1)

    def _raise(self, step: int, depth: int) -> None:
        self.core.set_depth(depth)
        self.changes.append((step, depth))
        self._strikes = []
        if self.budget is not None:
            self._budget_waits = self.budget.waits
        _log.debug("asyncthrottle: depth='auto' raised the depth to %d from step %d", depth, step)
