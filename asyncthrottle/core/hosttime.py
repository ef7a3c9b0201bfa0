"""Host time inside passes: the wall time a loop has run, what went into fetching, and what went
between the steps of a step loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rule import Core


class HostTimes:
    """Counts host time only inside passes; what the program does between them is not loop time.

    A pass is a wrapped loop from its first ``next()`` to its end (or
    ``break``); for ``step()``/``begin_step()``/``mark()`` loops, from the
    first step to ``drain()``. Inside passes, wall = fetch + between + body +
    wait, where fetching is a wrapped loop's ``next()`` on its source and
    between is the time from one ``end_step()`` to the next ``begin_step()``
    (the loop's own host work there: taking a batch, an evaluation, logging --
    the throttle cannot tell which, so it is never called fetching). The
    waits outside them (a ``drain()`` after a ``break``, ``Deferred.get()``
    between epochs) are counted apart (``outside_wait_s``), never taken from
    the body. Written by the loop's thread only; ``wall_s()`` is safe to read
    from any thread.

    Args:
        clock: the throttle's clock.
        core: the throttle's core: it counts and tells the fetches
            (``Core.fetched``), and tells the time between steps as one; its
            ``wait_s`` at each pass's start and end sorts the waits in or out
            of passes, and it is told when a pass ends (``Core.pause``).
    """

    __slots__ = ("_clock", "_closed_s", "_core", "_outside_s", "_paused_wait_s", "between_s",
                 "started", "step_end")

    def __init__(self, clock: Callable[[], float], core: Core) -> None:
        self._clock, self._core = clock, core
        # host seconds between the steps of step()/begin_step() loops
        self.between_s = 0.0
        # host seconds blocked on the device between the passes before the last one
        self._outside_s = 0.0
        # the core's wait_s when the last pass ended (the waits since, between passes, are not the
        # loop's): a wait costs this no hook
        self._paused_wait_s = 0.0
        # wall seconds of the passes that ended
        self._closed_s = 0.0
        # when the current pass began (None: between passes)
        self.started: float | None = None
        # when the last step ended (the time between steps of begin_step() loops)
        self.step_end = 0.0

    @property
    def fetch_s(self) -> float:
        """Host seconds a wrapped loop spent taking batches from its source (the core's count)."""
        return self._core.fetch_s

    @property
    def outside_wait_s(self) -> float:
        """Host seconds blocked on the device between passes (a ``drain()`` after a ``break``,
        ``Deferred.get()`` between epochs)."""
        if self.started is None:
            return self._outside_s + self._core.wait_s - self._paused_wait_s
        return self._outside_s

    def begin(self, now: float) -> None:
        """A pass starts now, unless one is running."""
        if self.started is None:
            self._outside_s += self._core.wait_s - self._paused_wait_s
            self.started = now

    def end(self, now: float) -> None:
        """The pass (if any) ends now; the core's parts hear of the pause."""
        if self.started is not None:
            self._closed_s += max(0.0, now - self.started)
            self.started = None
            self._paused_wait_s = self._core.wait_s
            self._core.pause(now)

    def between(self, step: int, start: float, seconds: float) -> None:
        """The host spent ``seconds`` from ``start`` between the step before and ``step`` (a
        ``begin_step()`` loop); the ``on_fetch`` hooks hear it as they hear a fetch."""
        self.between_s += seconds
        if self._core.on_fetch:
            self._core.fetched(step, start, seconds, counted=False)

    def wall_s(self) -> float:
        """Seconds inside passes, up to now while one runs; never negative."""
        started = self.started
        return max(0.0, self._closed_s + (self._clock() - started if started is not None else 0.0))
