"""The stall report: log once when the host has waited ``stall`` seconds for one step, never
touching an event."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._options import Option
from ..core.events import Event
from ..core.waits import WaitStrategy
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

_log = logging.getLogger("asyncthrottle")

# stall="auto" never reports a wait shorter than this (a compile, a slow first step)
STALL_FLOOR_S = 30.0
# stall="auto": this many of the loop's median step times
STALL_STEPS = 50
# a step longer than this, in the median, lifts "auto" above the floor
_SLOW_STEP_S = STALL_FLOOR_S / STALL_STEPS
# how often the watchdog thread looks (a report comes at most this late)
_WATCHDOG_PERIOD_S = 0.5


def check_stall(stall: object) -> float | str | None:
    """``stall=``: ``"auto"``, a number of seconds > 0, or None (off)."""
    if stall is None or stall == "auto":
        return stall  # type: ignore[return-value]
    if isinstance(stall, str):
        hint = (
            "write it stall='auto'"
            if stall.strip().lower() == "auto"
            else "pass 'auto', seconds or None"
        )
        raise ValueError(f"stall must be 'auto', a number of seconds > 0 or None, got {stall!r}: "
                         f"{hint}")
    if isinstance(stall, bool) or not isinstance(stall, (int, float)):
        raise TypeError(f"stall must be 'auto', a number of seconds > 0 or None, got {stall!r}")
    # also rejects NaN
    if not stall > 0 or math.isinf(stall):
        raise ValueError("stall must be 'auto', a finite number of seconds > 0 or None (off), got "
                         f"{stall!r}")
    return float(stall)


def rank() -> int | None:
    """This process's rank under an initialized ``torch.distributed`` (never imports torch), else
    None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank())


@dataclasses.dataclass(frozen=True)
class StallStats:
    """The field of :class:`~asyncthrottle.Stats` that the stall report supplies."""

    stalls: int = 0


class StallWatch(Part):
    """A part of the throttle: reports a wait that lasts ``stall`` seconds, once, and lets it go on.

    It reads the time each wait began and the core's counters; it never
    queries, records or synchronizes an event, so it may run on any thread.
    Where the wait checks a deadline anyway (``Hybrid``, ``Poll``, or ``Spin``
    with a ``timeout``), :meth:`wrap` gives it the report's time as its
    deadline: the wait ends there, the report is logged on the loop's
    thread, and the same wait resumes where it was (``waited=``: its sleep
    slices keep their length, the ``timeout`` counts from its start). Where
    the wait holds the thread in the driver (``"spin"`` without a timeout,
    ``"block"``, a custom strategy), the process's one daemon watchdog
    thread looks every half second while waits run (:meth:`look`); it
    holds the watch weakly, so a dropped throttle leaves no thread behind.

    ``stall=None`` ("auto") is :data:`STALL_STEPS` times the loop's median
    step time (measured between the starts of waits, so it costs nothing on
    steps that do not wait), at least :data:`STALL_FLOOR_S` seconds.

    Args:
        core: the throttle's core (read only).
        stall: seconds, or None for "auto".
        clock: the throttle's clock.
    """

    PLACE = 50
    OPTIONS = (
        Option("stall", "float | str | None", "auto",
               "log a wait that lasts this long, once, with every thread's stack",
               "[Frameworks: DDP](frameworks.md#a-stalled-step-and-the-slow-rank-with-no-sync)",
               lambda name, value: check_stall(value), wrong_type=([1],),
               wrong_value=(-5.0, "often"),
               help=("seconds after which a wait for one step is logged once, with every thread's "
                     'stack, as a stall; the wait goes on. ``"auto"`` (default): 50 median step '
                     'times, at least 30 s; None: off. Never touches an event.')),
    )
    STATS = StallStats

    @classmethod
    def build(cls, at: Build) -> StallWatch | None:
        """The watch, with the core's wait strategy wrapped; None when off or synchronous (nothing
        waits)."""
        stall, core = at.options["stall"], at.core
        if stall is None or core.synchronous:
            return None
        watch = cls(core, None if stall == "auto" else stall, at.clock)  # type: ignore[arg-type]
        core.wrap_wait(watch.wrap)
        return watch

    def fields(self) -> dict[str, Any]:
        return {"stalls": self.reports}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if not stats.stalls:
            return []
        return [f"  stalls: {stats.stalls} waits reported as stalled (logged on the "
                "'asyncthrottle' logger)"]

    def __init__(self, core: Core, stall: float | None, clock: Callable[[], float]) -> None:
        self.core, self.stall, self.clock = core, stall, clock
        self.reports = 0
        # (step, began, threshold) of the wait running
        self._waiting: tuple[int, float, float] | None = None
        # the step reported last: one report per stall, even across retries
        self._reported = -1
        # steps (-1: none) and time at the last wait's start
        self._mark_steps, self._mark_at = -1, 0.0
        self._step_s: deque[float] = deque(maxlen=16)
        # how many of them are longer than _SLOW_STEP_S (only then can the median lift the floor)
        self._slow = 0
        self._measured = 0
        self._auto = STALL_FLOOR_S
        # threshold(), kept current
        self._limit = stall if stall is not None else STALL_FLOOR_S
        # the waits hold the thread in the driver: the watchdog thread looks
        self._watchdog = False
        # the watchdog holds this watch (set and cleared by it, under its lock)
        self._watched = False

    def threshold(self) -> float:
        """Seconds a wait may take before it is reported."""
        return self._limit

    def wrap(self, wait: WaitStrategy, timeout: float | None) -> WaitStrategy:
        """The strategy to wait with: ``wait`` with the report's deadline, or ``wait`` as is and a
        watchdog."""
        if getattr(wait, "resumes", False) or (timeout is not None and wait.honours_timeout):
            # it checks a deadline anyway, and takes ``waited=`` to resume
            return _Deadline(wait, self)
        self._watchdog = True
        return wait

    def on_wait_begin(self, step: int) -> None:
        now, steps, marked = self.clock(), self.core.steps, self._mark_steps
        if steps > marked >= 0:
            measure = (now - self._mark_at) / (steps - marked)
            step_s = self._step_s
            if len(step_s) == step_s.maxlen and step_s[0] > _SLOW_STEP_S:
                self._slow -= 1
            step_s.append(measure)
            if measure > _SLOW_STEP_S:
                self._slow += 1
            self._measured += 1
            # "auto": a new median every 4 measures (sorted only when it can exceed the floor)
            if self.stall is None and self._measured % 4 == 0:
                half = len(step_s) // 2
                if self._slow >= len(step_s) - half:
                    self._auto = max(STALL_FLOOR_S, STALL_STEPS * sorted(step_s)[half])
                else:
                    self._auto = STALL_FLOOR_S
                self._limit = self._auto
        self._mark_steps, self._mark_at = steps, now
        self._waiting = (step, now, self._limit)
        # (after _waiting is set: the watchdog lets go of a watch only when it sees no wait)
        if self._watchdog and not self._watched:
            _WATCHDOG.begin(self)

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        # the watchdog lets go of the watch at its next look: no lock a wait
        self._waiting = None

    def on_pause(self, now: float) -> None:
        # the time between passes is no step's
        self._mark_steps = -1

    def close(self) -> None:
        """No wait runs any more: the watchdog lets go of the watch at its next look."""
        self._waiting = None

    def look(self) -> bool:
        """Report the wait running now if it passed its threshold and was not reported. Any
        thread."""
        waiting = self._waiting
        if waiting is None:
            return False
        step, began, limit = waiting
        waited = self.clock() - began
        if waited < limit or step == self._reported:
            return False
        self._reported = step
        self.reports += 1
        _log.warning("%s", self.report(step, waited, limit))
        return True

    def report(self, step: int, waited: float, limit: float) -> str:
        """The text of a report: who, which step, how long, what is in flight, and every thread's
        stack."""
        core = self.core
        # completed first: never ahead of steps
        completed, steps = core.completed, core.steps
        who = "" if (r := rank()) is None else f"rank {r}: "
        what = "drain() " if core.draining else ""
        lines = [
            f"asyncthrottle: {who}stalled: {what}waited {waited:.1f} s for step {step} "
            f"(stall={limit:.1f} s); {steps - completed} steps in flight (steps "
            f"{completed}..{steps - 1}), {completed} seen complete; still waiting. The host's "
            "threads:"
        ]
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        frames = sys._current_frames()
        try:
            for ident in list(frames):
                stack = [
                    entry
                    for entry in traceback.extract_stack(frames[ident])
                    if entry.filename != __file__
                ]
                lines.append(f"Thread {names.get(ident, '?')} ({ident}):")
                lines.append("".join(traceback.format_list(stack)).rstrip())
        finally:
            # This frame is among them: keeping it is a cycle that keeps the loop's pass and locals
            # alive.
            frames.clear()
        return "\n".join(lines)


class _Deadline:
    """A wait strategy that stops at the report's time, reports, and waits on (the loop's thread).

    It holds the watch weakly: the core holds this strategy and the watch holds the core, so a
    strong reference would be a cycle that only the cyclic garbage collector frees.
    """

    def __init__(self, wait: WaitStrategy, watch: StallWatch) -> None:
        self.wait, self.watch = wait, weakref.ref(watch)
        self.blocking_events, self.honours_timeout = wait.blocking_events, wait.honours_timeout
        self.resumes = True

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        watch, wait = self.watch(), self.wait
        waiting = watch._waiting if watch is not None else None
        # not the core's wait (or the watch is gone), or reported already
        if watch is None or waiting is None or waiting[0] == watch._reported:
            return wait(event, timeout)
        _, began, limit = waiting
        left = limit - (watch.clock() - began)
        # the timeout comes first: nothing to report
        if timeout is not None and timeout <= left:
            return wait(event, timeout)
        if wait(event, max(left, 0.0)):
            return True
        # the report, on the loop's thread; then the same wait resumes
        watch.look()
        return wait(event, timeout, waited=watch.clock() - began)


class _Watchdog:
    """The process's one watchdog thread: it looks at the watches whose waits run, every half
    second.

    A watch is added at the start of its first wait and let go by the thread
    at the first look that finds it not waiting, so a wait costs the loop's
    thread no lock (two attribute stores and a read; a lock and a condition a
    wait cost ~10 us a step on a busy 2-core machine). Watches are held
    weakly, so the thread never keeps a throttle alive; while no watch is
    held it sleeps on a condition, and a dropped throttle leaves no thread of
    its own behind. It is started at the first wait and wakes the loop's
    thread never.

    The hand-over needs no lock on the loop's side: the loop sets
    ``_waiting`` then reads ``_watched``; the thread clears ``_watched`` then
    reads ``_waiting``. Either the loop sees ``_watched`` cleared (and adds
    the watch again, under the lock) or the thread sees the wait (and keeps
    the watch). This leans on the GIL ordering the two threads' attribute
    stores and reads; a free-threaded build would need the lock back (or
    atomics) here.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._watches: weakref.WeakSet[StallWatch] = weakref.WeakSet()
        self._thread: threading.Thread | None = None
        # the thread sleeps until a wait begins
        self._parked = False

    def begin(self, watch: StallWatch) -> None:
        with self._cond:
            watch._watched = True
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="asyncthrottle-stall-watchdog", daemon=True
                )
                self._thread.start()
            elif self._parked:
                self._parked = False
                self._cond.notify()

    def _sweep(self) -> list[StallWatch]:
        """The watches waiting now; the others are let go. Under the lock."""
        waiting = []
        for watch in list(self._watches):
            if watch._waiting is None:
                # let go, unless a wait began meanwhile (see the class's docstring)
                watch._watched = False
                if watch._waiting is None:
                    self._watches.discard(watch)
                    continue
                watch._watched = True
            waiting.append(watch)
        return waiting

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._watches:
                    self._parked = True
                    cond.wait()
                # its own thread: never wakes the loop
                cond.wait(_WATCHDOG_PERIOD_S)
                watches = self._sweep()
            # popped: no reference stays while the thread sleeps
            while watches:
                watches.pop().look()


_WATCHDOG = _Watchdog()


def _forked() -> None:
    global _WATCHDOG
    # the parent's thread and lock did not come along
    _WATCHDOG = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
