"""A deterministic fake device and clock, for testing throttled loops without a GPU.

The host "launches" work of given durations; the device runs it in order on a
fake timeline; events complete when fake time passes them; ``synchronize()``
and the injected ``sleep`` advance the clock. Nothing here sleeps for real.

:func:`forbid_syncs` fails a unit test at the first host read of a device value (a host-device
sync on an accelerator), on a CPU-only CI machine too (:mod:`asyncthrottle.testing.forbid`).

Example:
    >>> from asyncthrottle.testing import FakeDevice
    >>> dev = FakeDevice()
    >>> thr = dev.throttle(depth=1, wait="spin")
    >>> for _ in thr.wrap(range(3)):
    ...     _ = dev.launch(0.010)      # 10 ms of device work per step
    >>> round(dev.clock(), 3), round(thr.stats.wait_s, 3)
    (0.03, 0.03)
"""

from __future__ import annotations

from typing import Any

from ..core.waits import Block, Hybrid, Poll, Spin, SpinBlock, WaitStrategy
from ..throttle import Throttle
from .forbid import ForbidSyncs, SyncError, forbid_syncs

__all__ = ["FakeClock", "FakeDevice", "FakeEvent", "ForbidSyncs", "SyncError", "forbid_syncs"]


class FakeClock:
    """Fake monotonic seconds: call it for the time, ``advance()`` or ``sleep()`` to move it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; advance() got {seconds!r}")
        self.now += seconds

    sleep = advance


class FakeEvent:
    """An event on a :class:`FakeDevice`; counts the calls made on it."""

    __slots__ = ("_device", "time")

    def __init__(self, device: FakeDevice) -> None:
        self._device = device
        # when the device reaches the marker
        self.time: float | None = None

    def record(self) -> None:
        dev = self._device
        dev.records += 1
        self.time = max(dev.busy_until, dev.clock())

    def query(self) -> bool:
        dev = self._device
        dev.queries += 1
        return self.time is None or dev.clock() >= self.time

    def synchronize(self) -> None:
        dev = self._device
        dev.syncs += 1
        if self.time is not None and dev.clock() < self.time:
            dev.clock.advance(self.time - dev.clock())

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time() needs both events recorded")
        return (end.time - self.time) * 1000.0


class FakeDevice:
    """One in-order device queue on a fake clock.

    Attributes:
        clock: the :class:`FakeClock` shared by host and device.
        busy_until: fake time at which the device finishes the work queued so far.
        busy_s: total device seconds launched.
        records, queries, syncs: calls made on this device's events.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.busy_until = self.clock()
        self.busy_s = 0.0
        self.records = self.queries = self.syncs = 0

    def launch(self, seconds: float) -> float:
        """Enqueue ``seconds`` of device work; returns when it will finish. Never blocks."""
        if seconds < 0:
            raise ValueError(f"launch() needs a duration >= 0, got {seconds!r}")
        self.busy_until = max(self.busy_until, self.clock()) + seconds
        self.busy_s += seconds
        return self.busy_until

    def host(self, seconds: float) -> None:
        """The host spends ``seconds`` (Python, data loading): time passes."""
        self.clock.advance(seconds)

    def synchronize(self) -> None:
        """Wait for all queued work, like ``torch.cuda.synchronize()``."""
        self.clock.advance(max(0.0, self.busy_until - self.clock()))

    def event(self) -> FakeEvent:
        """The event factory: pass ``events=device.event`` to a Throttle."""
        return FakeEvent(self)

    def _spinning_clock(self) -> float:
        """Each read while spinning on ``query()`` costs a microsecond, so deadlines arrive."""
        self.clock.advance(1e-6)
        return self.clock()

    @property
    def pending_s(self) -> float:
        """Seconds of work the device still has queued."""
        return max(0.0, self.busy_until - self.clock())

    def wait(self, kind: str = "poll", **options: Any) -> WaitStrategy:
        """A wait strategy that runs on this device's clock (``"poll"``, ``"spin"``, ``"block"``,
        ``"hybrid"``, ``"spin-block"``)."""
        if kind == "poll":
            # a fake clock does not move while spinning
            options.setdefault("spin_s", 0.0)
            return Poll(clock=self.clock, sleep=self.clock.sleep, **options)
        # its spin reads advance the clock; its sleeps advance it exactly
        if kind in ("hybrid", "spin-block"):
            # A spin on this clock ends by its reads (a microsecond each), not by other threads:
            # os.sched_yield() would only hand the core to other processes, a scheduler slice a
            # read on a busy machine (minutes for one test's milliseconds of fake spinning).
            options.setdefault("yield_gil", False)
        if kind == "hybrid":
            return Hybrid(clock=self._spinning_clock, sleep=self.clock.sleep, **options)
        if kind in ("spin", "block"):
            return (Spin if kind == "spin" else Block)(clock=self._spinning_clock, **options)
        if kind == "spin-block":
            return SpinBlock(clock=self._spinning_clock, **options)
        raise ValueError(f"kind must be 'poll', 'spin', 'block', 'hybrid' or 'spin-block', got "
                         f"{kind!r}")

    def throttle(self, depth: int | None = 2, *, wait: str | WaitStrategy = "poll",
                 **options: Any) -> Throttle:
        """A :class:`Throttle` on this device, its clock and its waits."""
        strategy = self.wait(wait) if isinstance(wait, str) else wait
        return Throttle(depth, events=self.event, wait=strategy, clock=self.clock, **options)
