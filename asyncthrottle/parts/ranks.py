"""Straggler scores: each rank's recent median step time, all-gathered every ``ranks_every`` steps, never waited for."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._options import check_int
from .timing import DeviceTiming
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build


def check_ranks_every(ranks_every: object) -> int | None:
    """``ranks_every=``: an int >= 1 (gather every that many steps) or None (off)."""
    return check_int("ranks_every", ranks_every, minimum=1,
                     rule="an int >= 1 (gather the ranks' step times every that many steps) or None (off)",
                     fix="e.g. ranks_every=100")


def _flat_scores(scores: tuple[float, ...] | None) -> dict[str, Any]:
    return {f"rank_score_{r}": score for r, score in enumerate(scores or ())}


@dataclasses.dataclass(frozen=True)
class RankStats:
    """The fields of :class:`~asyncthrottle.Stats` that straggler scores supply."""

    rank_scores: tuple[float, ...] | None = dataclasses.field(default=None, metadata={"flat": _flat_scores})
    slowest_rank: int | None = None


def scores(medians: list[float]) -> tuple[tuple[float, ...], int | None]:
    """Each rank's score (the fastest median over its own; NaN without one) and the rank with the lowest."""
    known = [m for m in medians if m > 0 and math.isfinite(m)]
    if not known:
        return tuple(math.nan for _ in medians), None
    fastest = min(known)
    result = tuple(fastest / m if m > 0 and math.isfinite(m) else math.nan for m in medians)
    slowest = min((s, r) for r, s in enumerate(result) if not math.isnan(s))[1]
    return result, slowest


class RankScores(Part):
    """A part of the throttle: this rank's recent median step time, gathered across ranks without a wait.

    Step times come from the device timing samples (:class:`DeviceTiming`)
    when the device is timed, else from the host clock between records (on
    the CPU, a synchronous backend, that is the step). The median covers
    about the last ``every`` steps. At the record of every ``every``-th step
    -- the same steps on every rank, so the collectives match -- the median
    is all-gathered with ``async_op=True`` on a gloo group of its own (CPU
    tensors: no device, no stream, no sync), made at the first gather (a
    collective: every rank must run the throttle). The result is read once
    ``work.is_completed()`` says so, polled at the following records and when
    a pass ends; nothing waits for it. Off while ``torch.distributed`` is not
    initialized (checked at each gather step, so a process group made after
    the throttle counts).

    Args:
        core: the throttle's core.
        every: gather every ``every`` steps.
        timing: the throttle's device timing, or None.
        sample_every: how often ``timing`` samples a step.
    """

    OPTIONS = ("ranks_every",)
    STATS = RankStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        check_ranks_every(options["ranks_every"])

    @classmethod
    def build(cls, at: Build) -> RankScores | None:
        every = at.options["ranks_every"]
        if every is None:
            return None
        return cls(at.core, every, at.part(DeviceTiming), at.options["sample_every"] or 1)

    def fields(self) -> dict[str, Any]:
        return {"rank_scores": self.scores, "slowest_rank": self.slowest}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        scores, slowest = stats.rank_scores, stats.slowest_rank
        if scores is None:
            return []
        listed = ", ".join(f"{score:.2f}" for score in scores)
        if slowest is None:
            return [f"  ranks: no step times yet (scores {listed})"]
        return [f"  ranks: slowest is rank {slowest} (score {scores[slowest]:.2f}: the fastest rank's median step "
                f"time over its own); scores by rank {listed}"]

    def __init__(self, core: Core, every: int, timing: DeviceTiming | None, sample_every: int) -> None:
        self.core, self.every, self.timing = core, every, timing
        per = sample_every if timing is not None else 1
        self.samples: deque[float] = deque(maxlen=max(3, every // per))  # recent step times, seconds
        self.scores: tuple[float, ...] | None = None
        self.slowest: int | None = None
        self.gathers = 0  # gathers read
        self._gather_at = every - 1  # the step at whose record the next gather starts
        self._next = self._gather_at  # the next record that has anything to do
        self._works: deque[tuple[Any, list[Any]]] = deque()  # gathers in flight, oldest first
        self._group: Any = None
        self._last: float | None = None  # the last record's time (host samples)
        if timing is not None:
            timing.add_listener(self._on_sample)
        core.subscribe(self)  # on_record, on_pause

    def _on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
        self.samples.append(busy_s)

    def on_record(self, step: int, event: object, now: float) -> None:
        timing = self.timing
        if timing is None or not timing.enabled:  # no device timing: the host's step time
            last, self._last = self._last, now
            if last is not None:
                self.samples.append(now - last)
        if step >= self._next:
            self._poll()
            if step >= self._gather_at:
                self._gather_at += self.every
                self._launch()
            self._next = step + 1 if self._works else self._gather_at

    def on_pause(self, now: float) -> None:
        self._last = None  # the time between passes is no step's
        self._poll()

    def median(self) -> float:
        """This rank's recent median step time in seconds (NaN before any sample)."""
        ordered = sorted(self.samples)
        return ordered[len(ordered) // 2] if ordered else math.nan

    def _poll(self) -> None:
        """Read every finished gather, oldest first; queries only (``is_completed``), never waits."""
        works = self._works
        while works and works[0][0].is_completed():
            _, rows = works.popleft()  # rows start as NaN: a gather that failed (a peer left) reads NaN
            self.scores, self.slowest = scores([float(row[0]) for row in rows])  # CPU tensors: no sync
            self.gathers += 1

    def _launch(self) -> None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        import torch

        if self._group is None:  # a collective, once: every rank makes it at the same step
            self._group = dist.new_group(backend="gloo")
        mine = torch.tensor([self.median()], dtype=torch.float64)
        rows = [torch.full_like(mine, math.nan) for _ in range(dist.get_world_size(self._group))]
        work = dist.all_gather(rows, mine, group=self._group, async_op=True)  # never waited for
        self._works.append((work, rows))
