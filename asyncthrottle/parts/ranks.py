"""Straggler scores: each rank's recent median step time, all-gathered every ``ranks_every`` steps,
never waited for."""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._options import Option, check_int, check_positive
from ._build import Part
from .sections import Sections
from .timing import DeviceTiming

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build
    from .timing import Sampling

_log = logging.getLogger("asyncthrottle")
# + rank: the last step whose gather the rank started (default store)
_KEY = "asyncthrottle/ranks_every/step/"
# ranks_timeout's default, seconds: far below gloo's 30 minutes, above a rank's evaluation
TIMEOUT_S = 300.0
# where the docs say more of the ranks' options
_DDP = "[Frameworks: DDP](frameworks.md#a-stalled-step-and-the-slow-rank-with-no-sync)"

def check_ranks_every(ranks_every: object) -> int | None:
    """``ranks_every=``: an int >= 1 (gather every that many steps) or None (off)."""
    return check_int("ranks_every", ranks_every, minimum=1,
                     rule="an int >= 1 (gather the ranks' step times every that many steps) or "
                          "None (off)",
                     fix="e.g. ranks_every=100")


def check_ranks_timeout(ranks_timeout: object) -> float:
    """``ranks_timeout=``: seconds > 0, finite (the gathers' group waits at most that long)."""
    seconds = check_positive("ranks_timeout", ranks_timeout,
                             rule="a number of seconds > 0 (how long the ranks' gathers wait for "
                                  "another rank)", fix=f"e.g. ranks_timeout={TIMEOUT_S:g}")
    if seconds is None:
        raise TypeError(f"ranks_timeout must be a number of seconds > 0, got None; pass e.g. "
                        f"ranks_timeout={TIMEOUT_S:g} (the default)")
    return seconds


def _flat_scores(scores: tuple[float, ...] | None) -> dict[str, Any]:
    return {f"rank_score_{r}": score for r, score in enumerate(scores or ())}


def _flat_stopped(stopped: tuple[int, ...] | None) -> dict[str, Any]:
    return {} if stopped is None else {"ranks_stopped": len(stopped)}


@dataclasses.dataclass(frozen=True)
class RankStats:
    """The fields of :class:`~asyncthrottle.Stats` that straggler scores supply."""

    rank_scores: tuple[float, ...] | None = dataclasses.field(default=None,
                                                              metadata={"flat": _flat_scores})
    slowest_rank: int | None = None
    stopped_ranks: tuple[int, ...] | None = dataclasses.field(default=None,
                                                              metadata={"flat": _flat_stopped})


def scores(medians: list[float]) -> tuple[tuple[float, ...], int | None]:
    """Each rank's score (the fastest median over its own; NaN without one) and the rank with the
    lowest."""
    known = [m for m in medians if m > 0 and math.isfinite(m)]
    if not known:
        return tuple(math.nan for _ in medians), None
    fastest = min(known)
    result = tuple(fastest / m if m > 0 and math.isfinite(m) else math.nan for m in medians)
    slowest = min((s, r) for r, s in enumerate(result) if not math.isnan(s))[1]
    return result, slowest


class RankScores(Part):
    """A part of the throttle: this rank's recent median step time, gathered across ranks without a
    wait.

    Step times come from the device timing samples (:class:`DeviceTiming`)
    when the device is timed, else from the host clock between records (on
    the CPU, a synchronous backend, that is the step). When the loop has
    sections (:meth:`~asyncthrottle.Throttle.section`), the sum of each timed
    step's sections that are not ``collective`` -- the rank's own work --
    replaces the step time: in plain DDP every step ends in an all-reduce, a
    barrier, so every rank's step time is the slowest rank's and step times
    cannot name it. The median covers
    about the last ``every`` steps. At the record of every ``every``-th step
    -- the same steps on every rank, so the collectives match -- the median
    is all-gathered with ``async_op=True`` on a gloo group of its own (CPU
    tensors: no device, no stream, no sync). The group is made at the first
    record (a collective: every rank must run the throttle, and this rank
    waits for the others there) with a timeout of ``ranks_timeout`` seconds,
    at most the default process group's; a rank that never joins it is
    logged once and the scores stay unknown. Results are read once
    ``work.is_completed()`` says so, polled at the following records; leaving
    a loop (its end, a ``break``, ``pause()``, ``drain()``) never waits for
    them: the gathers still in flight are read at the next pass's records.
    A rank whose data ended early (so it stopped calling the throttle) fails
    the gathers it never joins once the group's timeout has passed: that is
    logged once, naming the rank and the step, gathering stops, and the
    scores stay those of the last gather read (``stopped_ranks`` names the
    rank). Off while ``torch.distributed`` is not initialized (checked at
    each gather step, so a process group made after the throttle counts).

    Args:
        core: the throttle's core.
        every: gather every ``every`` steps.
        timing: the throttle's device timing, or None (its samples: ``on_sample``).
        sampling: the steps ``timing`` samples.
        sections: the throttle's sections, or None (their sums: ``on_sections``).
        timeout: seconds the gathers' group waits for another rank (``ranks_timeout``).
    """

    PLACE = 60
    OPTIONS = (
        Option("ranks_every", "int | None", None,
               "straggler scores across `torch.distributed` ranks", _DDP,
               lambda name, value: check_ranks_every(value), wrong_type=("100",),
               wrong_value=(0,),
               help=("under ``torch.distributed``, all-gather the ranks' recent median step times "
                     "(their sections' own work, when the loop has sections) every that many "
                     'steps, without a wait, for ``stats.rank_scores``/``slowest_rank``; every '
                     'rank must use it.')),
        Option("ranks_timeout", "float", TIMEOUT_S,
               "seconds the ranks' gathers wait for another rank before they stop (at most the "
               "process group's timeout)", _DDP, lambda name, value: check_ranks_timeout(value),
               wrong_type=("60", None), wrong_value=(0, math.inf),
               help=("with ``ranks_every``: seconds the ranks' gathers wait for another rank "
                     '(their group is made at the first record, a collective) before they stop, at'
                     " most the process group's timeout (default 300; gloo's own is 30 minutes).")),
    )
    STATS = RankStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        """``ranks_timeout=`` bounds the gathers of ``ranks_every=``: without them it would do
        nothing, which is a ``ValueError`` (the default is not told from the same value given)."""
        timeout = options["ranks_timeout"]
        if options["ranks_every"] is None and timeout != TIMEOUT_S:
            raise ValueError(f"ranks_timeout={timeout!r} was given without ranks_every=, so no "
                             "gather runs for it to bound; pass ranks_every= (e.g. "
                             "ranks_every=100) to gather the ranks' step times, or drop "
                             "ranks_timeout=")

    @classmethod
    def build(cls, at: Build) -> RankScores | None:
        every = at.options["ranks_every"]
        if every is None:
            return None
        return cls(at.core, every, at.part(DeviceTiming), at.sampling, at.part(Sections),
                   at.options["ranks_timeout"])

    def fields(self) -> dict[str, Any]:
        return {"rank_scores": self.scores, "slowest_rank": self.slowest,
                "stopped_ranks": self.stopped}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        scores, slowest = stats.rank_scores, stats.slowest_rank
        lines = []
        if scores is not None:
            listed = ", ".join(f"{score:.2f}" for score in scores)
            lines.append(f"  ranks: no step times yet (scores {listed})" if slowest is None else
                         f"  ranks: slowest is rank {slowest} (score {scores[slowest]:.2f}: the "
                         f"fastest rank's median step time over its own); scores by rank {listed}")
        return lines + ([] if stats.stopped_ranks is None else [stopped_line(stats)])

    def __init__(self, core: Core, every: int, timing: DeviceTiming | None, sampling: Sampling,
                 sections: Sections | None = None, timeout: float = TIMEOUT_S) -> None:
        self.core, self.every, self.timing = core, every, timing
        self.limit = timedelta(seconds=timeout)
        per = sampling.per_sample() if timing is not None else 1
        # recent step times, seconds
        self.samples: deque[float] = deque(maxlen=max(3, every // per))
        per = sections.sampling.per_sample() if sections is not None else 1
        # recent sums of sections, seconds
        self.own: deque[float] = deque(maxlen=max(3, every // per))
        self.scores: tuple[float, ...] | None = None
        self.slowest: int | None = None
        # once gathering stopped: the ranks behind, as the store tells
        self.stopped: tuple[int, ...] | None = None
        self.gathers = 0
        # the step at whose record the next gather starts
        self._gather_at = every - 1
        # the next record that has anything to do
        self._next = self._gather_at
        # gathers in flight (work, rows, step), oldest first
        self._works: deque[tuple[Any, list[Any], int]] = deque()
        # the gather's group; False once gathering stopped (a rank never came)
        self._group: Any = None
        # the group's timeout (ranks_timeout, at most the default process group's)
        self._timeout: Any = None
        # the last record's time (host samples)
        self._last: float | None = None
        # the first record makes the group
        self._next = 0

    def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
        self.samples.append(busy_s)

    def on_sections(self, step: int, own_s: float, seconds: dict[str, float]) -> None:
        if own_s > 0:
            self.own.append(own_s)

    def on_record(self, step: int, event: object, now: float) -> None:
        timing = self.timing
        # no device timing: the host's step time
        if timing is None or not timing.enabled:
            last, self._last = self._last, now
            if last is not None:
                self.samples.append(now - last)
        if step >= self._next:
            if self._group is None and step < self._gather_at:
                self._make_group(step)
            self._poll()
            if step >= self._gather_at:
                self._gather_at += self.every
                self._launch(step)
            self._next = step + 1 if self._works else self._gather_at

    def on_pause(self, now: float) -> None:
        # the time between passes is no step's
        self._last = None
        # never a wait (the other ranks may be anywhere): what is still in flight is read at the
        # next pass's records (self._next stays at the next step while gathers are in flight)
        self._poll()

    def close(self) -> None:
        """Drop the gloo group and the gathers in flight (their work, their tensors), never waiting
        for them: the scores stay those of the last gather read.

        Also at the interpreter's exit, before its finalization (the throttle's finalizer runs
        then): a gloo group or a gather's work destroyed while the interpreter is torn down aborts
        the process ("terminate called without an active exception", SIGABRT), after
        ``destroy_process_group()`` too, which leaves the group to the references still held.
        """
        self._works.clear()
        if self._group is not None:
            self._group = False

    def median(self) -> float:
        """This rank's recent median step time (or own work, with sections) in seconds; NaN before
        any sample."""
        ordered = sorted(self.own or self.samples)
        return ordered[len(ordered) // 2] if ordered else math.nan

    def _poll(self) -> None:
        """Read every finished gather, oldest first; queries only (``is_completed``), never
        waits."""
        works = self._works
        while works and works[0][0].is_completed():
            work, rows, step = works[0]
            try:
                # completed: returns at once, or raises what failed it
                work.wait()
            except Exception as exc:
                self._stop(step, exc)
                return
            works.popleft()
            # CPU tensors: no sync
            self.scores, self.slowest = scores([float(row[0]) for row in rows])
            self.gathers += 1

    def _dist(self) -> Any:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return dist

    def _make_group(self, step: int) -> bool:
        """Make the gather's gloo group (a collective) with the default group's timeout; False if it
        failed."""
        if self._group is not None:
            return self._group is not False
        dist = self._dist()
        if dist is None:
            return False
        import torch

        try:
            timeout = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
        # another torch's internals (or no CPU backend): torch's default for gloo
        except Exception:
            timeout = dist.distributed_c10d._get_default_timeout("gloo")
        self._timeout = min(timeout, self.limit)
        self._mark(dist, -1)
        try:
            self._group = dist.new_group(backend="gloo", timeout=self._timeout)
        except Exception as exc:
            self._stop(step, exc, making=True)
            return False
        return True

    def _launch(self, step: int) -> None:
        dist = self._dist()
        if dist is None or not self._make_group(step):
            return
        import torch

        self._mark(dist, step)
        mine = torch.tensor([self.median()], dtype=torch.float64)
        rows = [torch.full_like(mine, math.nan) for _ in range(dist.get_world_size(self._group))]
        # never waited for
        work = dist.all_gather(rows, mine, group=self._group, async_op=True)
        self._works.append((work, rows, step))

    def _mark(self, dist: Any, step: int) -> None:
        """Tell the other ranks (the default store) the last step whose gather this rank started."""
        try:
            dist.distributed_c10d._get_default_store().set(_KEY + str(dist.get_rank()), str(step))
        # no store to tell (another torch): a stopped rank is then not named
        except Exception:
            pass

    def _behind(self, dist: Any, step: int) -> list[tuple[int, str]]:
        """The ranks whose last gather is before ``step`` (or that never started one), as told by
        the store, each with what it told."""
        try:
            store = dist.distributed_c10d._get_default_store()
            behind = []
            me = dist.get_rank()
            for rank in range(dist.get_world_size()):
                key = _KEY + str(rank)
                if rank == me:
                    continue
                if not store.check([key]):
                    behind.append((rank, "it never ran a throttle with ranks_every"))
                    continue
                last = int(store.get(key))
                if last < step:
                    behind.append((rank, f"its last gather: step {last}" if last >= 0
                                   else "no gather yet"))
            return behind
        except Exception:
            return []

    def _stop(self, step: int, exc: BaseException | None, *, making: bool = False) -> None:
        """A gather (or the group) failed: a rank stopped calling the throttle. Log once, gather no
        more; the last scores stay."""
        dist = self._dist()
        rank = dist.get_rank() if dist is not None else -1
        behind = [] if dist is None else self._behind(dist, step)
        named = ", ".join(f"rank {r} ({told})" for r, told in behind) or "some other rank"
        what = (f"making the gathers' gloo group at step {step}" if making
                else f"the gather of step {step}")
        _log.warning(
            "asyncthrottle: ranks_every: rank %d: %s had no answer from %s within the ranks' "
            "timeout (%s: ranks_timeout, at most the process group's) and gave up: a rank whose "
            "data ended early, or that never runs a throttle with ranks_every=%d, stops the "
            "gathers (every rank must run the same steps); no more gathers, and the scores stay "
            "those of the last gather read. (%s)",
            rank, what, named, self._timeout, self.every, exc,
        )
        self._group = False
        self._works.clear()
        self.stopped = tuple(r for r, _ in behind)


def stopped_line(stats: Stats) -> str:
    """The summary's line once the gathers stopped: when, and which ranks the store named."""
    stopped = stats.stopped_ranks or ()
    who = ", ".join(f"rank {r}" for r in stopped) or "a rank"
    last = ("the scores above are the last gather's" if stats.rank_scores is not None
            else "no gather was read")
    return (f"  ranks: the gathers stopped: {who} stopped calling the throttle (its data ended, or "
            f"it runs no ranks_every); {last}")
