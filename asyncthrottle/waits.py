"""How the host waits for an event: spin, block in the driver, or poll."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .events import Event

__all__ = ["Block", "Poll", "Spin", "WaitStrategy", "resolve_wait"]


@runtime_checkable
class WaitStrategy(Protocol):
    """Waits until an event completes.

    ``blocking_events`` asks the backend for events whose ``synchronize()``
    sleeps in the driver (CUDA's blocking-sync events) instead of spinning.
    ``honours_timeout`` says whether a ``timeout`` can cut the wait short.
    """

    blocking_events: bool
    honours_timeout: bool

    def __call__(self, event: Event, timeout: float | None) -> bool:
        """Wait for ``event``; return False if ``timeout`` seconds passed first."""


class Spin:
    """The event's own ``synchronize()``: lowest latency, one core busy while waiting.

    With a ``timeout`` it spins on ``query()`` in Python instead, so the
    deadline (and Ctrl-C) can be honoured. Without one, a ``KeyboardInterrupt``
    is only seen once the event completes.
    """

    blocking_events = False
    honours_timeout = True

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock

    def __call__(self, event: Event, timeout: float | None) -> bool:
        if timeout is None:
            event.synchronize()  # host-device sync: the depth rule requires this step.
            return True
        deadline = self._clock() + timeout
        while not event.query():
            if self._clock() >= deadline:
                return False
        return True


class Block(Spin):
    """``synchronize()`` on blocking-sync events: the thread sleeps in the driver.

    No core is burnt, wake-up costs the driver's latency, and neither Ctrl-C
    nor a timeout can interrupt the wait (the driver holds the thread).
    On backends without blocking events this is the same as ``Spin``.
    """

    blocking_events = True
    honours_timeout = False


class Poll:
    """Query, then sleep in slices that grow with the wait: responsive and cheap.

    After ``spin_s`` seconds of spinning on ``query()`` (none by default: a
    Python spin holds the GIL, which starves runtimes whose completion needs a
    Python thread, and buys nothing on a GPU), the host sleeps for
    ``fraction`` of the time waited so far, between ``min_sleep_s`` and
    ``max_sleep_s``. The overshoot after the event completes is therefore at
    most ``fraction`` of the wait plus the OS's sleep granularity (~60 us on
    Linux), a long wait burns almost no CPU, and a ``KeyboardInterrupt``
    arrives within ``max_sleep_s`` (a signal also cuts the sleep short).

    Args:
        spin_s: seconds to spin before the first sleep.
        fraction: sleep slice as a fraction of the time waited so far.
        min_sleep_s: shortest sleep slice.
        max_sleep_s: longest sleep slice (bounds Ctrl-C latency); at most 0.1.
        clock: monotonic clock in seconds.
        sleep: the sleep function (the fake device injects its own).
    """

    blocking_events = False
    honours_timeout = True

    def __init__(
        self,
        *,
        spin_s: float = 0.0,
        fraction: float = 0.01,
        min_sleep_s: float = 1e-5,
        max_sleep_s: float = 2e-3,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < max_sleep_s <= 0.1:
            raise ValueError(f"max_sleep_s must be in (0, 0.1] to keep Ctrl-C responsive, got {max_sleep_s!r}")
        if not 0 <= min_sleep_s <= max_sleep_s:
            raise ValueError(f"min_sleep_s must be in [0, max_sleep_s], got {min_sleep_s!r}")
        if spin_s < 0 or fraction <= 0:
            raise ValueError(f"spin_s must be >= 0 and fraction > 0, got {spin_s!r} and {fraction!r}")
        self.spin_s, self.fraction = spin_s, fraction
        self.min_sleep_s, self.max_sleep_s = min_sleep_s, max_sleep_s
        self._clock, self._sleep = clock, sleep

    def __call__(self, event: Event, timeout: float | None) -> bool:
        start = self._clock()
        while not event.query():
            waited = self._clock() - start
            if timeout is not None and waited >= timeout:
                return False
            if waited < self.spin_s:
                continue
            nap = min(self.max_sleep_s, max(self.min_sleep_s, waited * self.fraction))
            if timeout is not None:  # stop at the deadline, but always move on (a fake clock rounds)
                nap = max(min(nap, timeout - waited), self.min_sleep_s, 1e-9)
            self._sleep(nap)
        return True


_BY_NAME: dict[str, Callable[[], WaitStrategy]] = {"spin": Spin, "block": Block, "poll": Poll}


def resolve_wait(wait: str | WaitStrategy) -> WaitStrategy:
    """Turn ``wait=`` into a strategy object, or explain what is allowed."""
    if isinstance(wait, str):
        if wait not in _BY_NAME:
            raise ValueError(f"wait must be one of {sorted(_BY_NAME)} or a WaitStrategy, got {wait!r}")
        return _BY_NAME[wait]()
    if isinstance(wait, type):
        raise TypeError(
            f"wait={wait.__name__} is a class; pass an instance such as wait={wait.__name__}() "
            f"(or a name: one of {sorted(_BY_NAME)})"
        )
    if isinstance(wait, WaitStrategy):
        return wait
    raise TypeError(
        f"wait must be one of {sorted(_BY_NAME)} or an object with __call__(event, timeout), "
        f"blocking_events and honours_timeout, got {type(wait).__name__}"
    )
