"""Host time inside passes: the wall time a loop has run, and how much of it went into fetching."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["HostTimes"]


class HostTimes:
    """Counts host time only inside passes; what the program does between them is not loop time.

    A pass is a wrapped loop from its first ``next()`` to its end (or
    ``break``); for ``step()``/``begin_step()``/``mark()`` loops, from the
    first step to ``drain()``. Written by the loop's thread only; ``wall_s()``
    is safe to read from any thread.

    Args:
        clock: the throttle's clock.
        on_fetch: the core's ``on_fetch`` subscribers, told of each fetch.
    """

    __slots__ = ("_clock", "_closed_s", "_on_fetch", "fetch_s", "started", "step_end")

    def __init__(self, clock: Callable[[], float], on_fetch: list[Callable[..., Any]]) -> None:
        self._clock, self._on_fetch = clock, on_fetch
        self.fetch_s = 0.0  # host seconds taking batches (or between steps)
        self._closed_s = 0.0  # wall seconds of the passes that ended
        self.started: float | None = None  # when the current pass began (None: between passes)
        self.step_end = 0.0  # when the last step ended (the fetch time of begin_step() loops)

    def begin(self, now: float) -> None:
        """A pass starts now, unless one is running."""
        if self.started is None:
            self.started = now

    def end(self, now: float) -> None:
        """The pass (if any) ends now."""
        if self.started is not None:
            self._closed_s += max(0.0, now - self.started)
            self.started = None

    def fetched(self, step: int, start: float, seconds: float) -> None:
        """The host spent ``seconds`` from ``start`` taking ``step``'s batch (or between steps)."""
        self.fetch_s += seconds
        for hook in self._on_fetch:
            hook(step, start, seconds)

    def wall_s(self) -> float:
        """Seconds inside passes, up to now while one runs; never negative."""
        started = self.started
        return max(0.0, self._closed_s + (self._clock() - started if started is not None else 0.0))
