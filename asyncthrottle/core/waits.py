"""How the host waits for an event: spin, block in the driver, poll, sleep-then-spin (hybrid), or
spin-then-block."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .checks import check_bool, check_callable, check_int, check_real
from .events import Event


@runtime_checkable
class WaitStrategy(Protocol):
    """Waits until an event completes.

    ``blocking_events`` asks the backend for events whose ``synchronize()``
    sleeps in the driver (CUDA's blocking-sync events) instead of spinning.
    ``honours_timeout`` says whether a ``timeout`` can cut the wait short.

    Optional: ``resumes = True`` says the wait checks a deadline anyway, so a
    caller may stop it at one (a stall report) and resume it at no extra cost
    by calling it again with ``waited=`` the seconds it already lasted (its
    naps keep their length, ``timeout`` counts from the first call). A
    strategy without it is watched from a thread instead.
    """

    blocking_events: bool
    honours_timeout: bool

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        """Wait for ``event``; return False if ``timeout`` seconds passed first (``waited`` counts
        against it)."""


class Spin:
    """The event's own ``synchronize()``: lowest latency, one core busy while waiting.

    With a ``timeout`` it spins on ``query()`` in Python instead, so the
    deadline (and Ctrl-C) can be honoured. Without one, a ``KeyboardInterrupt``
    is only seen once the event completes.
    """

    blocking_events = False
    honours_timeout = True

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = _check_clock(clock)

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        """``waited``: seconds this wait already lasted (a stall report interrupted it); counts
        against ``timeout``."""
        if timeout is None:
            event.synchronize()  # host-device sync: the depth rule requires this step.
            return True
        deadline = self._clock() + timeout - waited
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


def _low_quantile(waits: deque[float], quantile: float, min_samples: int) -> float | None:
    """The ``quantile`` of the remembered wait durations; None before ``min_samples`` of them."""
    if len(waits) < min_samples:
        return None
    ordered = sorted(waits)
    return ordered[int(quantile * (len(ordered) - 1))]


class SpinBlock(Block):
    """Spin while this loop's waits are short, else sleep in the runtime's own wait: no core taken
    from a device that computes on the host's cores.

    A wait predicted shorter than ``spin_s`` (a low quantile of the last
    ``history`` wait durations, as :class:`Hybrid` predicts; no prediction in
    the first ``min_samples`` waits) spins on ``query()``, yielding the GIL, for
    up to ``spin_s``; a longer wait, or one still unfinished after the spin,
    calls the event's ``synchronize()``, which sleeps in the runtime (JAX's
    ``block_until_ready``, CUDA's blocking-sync events) and wakes when the
    step completes.

    The default for JAX's CPU backend (``wait="auto"``): there the "device" is
    the host's own cores, every cycle the host spends waiting is taken from the
    step's computation, and each wake-up from a sleep slice preempts one of
    XLA's threads; a blocking wait costs one wake-up. A ``timeout`` cannot cut
    the runtime's wait short (``timeout=`` is refused; ``"auto"`` picks
    ``"hybrid"`` then), and a stall is reported by the watchdog thread.
    Ctrl-C: JAX's ``block_until_ready`` looks for signals every 200 ms
    (jaxlib's ``BlockUntilReadyWithCancel``), so a ``KeyboardInterrupt``
    arrives within that (0.10 s measured, ``benchmarks/jax_ctrl_c.py``);
    CUDA's blocking-sync events hold the thread until the step completes.

    Args:
        spin_s: the longest spin, and the predicted wait below which it spins first.
        history: wait durations remembered.
        quantile: which quantile of them predicts the next wait.
        min_samples: waits timed before predicting (until then it spins first).
        yield_gil: call ``os.sched_yield()`` between queries while spinning.
        clock: monotonic clock in seconds.
    """

    def __init__(
        self,
        *,
        spin_s: float = 1e-4,
        history: int = 16,
        quantile: float = 0.25,
        min_samples: int = 3,
        yield_gil: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(clock=clock)
        check_real("spin_s", spin_s, low=0, rule=">= 0 (seconds)",
                   fix="e.g. spin_s=1e-4 (100 us; 0 never spins)")
        _check_history(history, min_samples, quantile)
        check_bool("yield_gil", yield_gil)
        self.spin_s, self.quantile, self.min_samples = spin_s, quantile, min_samples
        self.yield_gil = yield_gil
        # seconds from each call to complete
        self._waits: deque[float] = deque(maxlen=history)
        # how many of them are shorter than spin_s: whether the prediction is, without a sort
        self._short = 0

    def predict(self) -> float | None:
        """Seconds the next wait is expected to take, or None before ``min_samples`` waits."""
        return _low_quantile(self._waits, self.quantile, self.min_samples)

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        """``timeout`` must be None (``honours_timeout`` is False: the throttle refuses one)."""
        clock, waits, spin_s = self._clock, self._waits, self.spin_s
        start = clock()
        known = len(waits)
        # predict() < spin_s: the quantile's place in the sorted waits holds a short one
        if known < self.min_samples or self._short > int(self.quantile * (known - 1)):
            query, yield_gil = event.query, self.yield_gil
            until = start + spin_s
            while not query():
                if clock() >= until:
                    break
                if yield_gil:
                    # releases the GIL to other Python threads
                    os.sched_yield()
            else:
                self._remember(clock() - start)
                return True
        event.synchronize()  # host-device sync: the depth rule requires this step; sleeps in it.
        self._remember(clock() - start)
        return True

    def _remember(self, seconds: float) -> None:
        waits, spin_s = self._waits, self.spin_s
        if len(waits) == waits.maxlen and waits[0] < spin_s:
            # the oldest, a short one, goes
            self._short -= 1
        waits.append(seconds)
        if seconds < spin_s:
            self._short += 1


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
    resumes = True

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
        _check_sleeps(min_sleep_s, max_sleep_s)
        check_real("spin_s", spin_s, low=0, rule=">= 0 (seconds)",
                   fix="e.g. spin_s=0 (the default: a Python spin holds the GIL)")
        _check_fraction(fraction)
        self.spin_s, self.fraction = spin_s, fraction
        self.min_sleep_s, self.max_sleep_s = min_sleep_s, max_sleep_s
        self._clock, self._sleep = _check_clock(clock), _check_sleep(sleep)

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        """``waited``: seconds this wait already lasted (a stall report interrupted it): the slices
        go on growing."""
        start = self._clock() - waited
        while not event.query():
            waited = self._clock() - start
            if timeout is not None and waited >= timeout:
                return False
            if waited < self.spin_s:
                continue
            nap = min(self.max_sleep_s, max(self.min_sleep_s, waited * self.fraction))
            # stop at the deadline, but always move on (a fake clock rounds)
            if timeout is not None:
                nap = max(min(nap, timeout - waited), self.min_sleep_s, 1e-9)
            self._sleep(nap)
        return True


class Hybrid:
    """Sleep until just before the event is predicted to complete, then spin: spin's speed, little
    CPU.

    Each wait is timed; the prediction is a low quantile of the last ``history``
    wait durations (a strategy object belongs to one throttle, so these are one
    loop's waits). The host sleeps until the prediction minus a margin (the
    measured sleep overshoot, ~70-100 us on Linux, plus ``jitter`` of the
    prediction plus ``slack_s``), then spins on ``query()``. A long sleep is
    taken in two: the second at most an eighth of the prediction (or four
    overshoots) long, ending at the wake-up. If the event is
    still unfinished after spinning for twice the margin (at least ``spin_s``),
    or there is no prediction yet (the first ``min_samples`` waits), it sleeps
    in slices of ``fraction`` of the time waited, like :class:`Poll`. A wait
    whose event completed while the host slept records only the time before
    that sleep (a lower bound: close to the truth when it was the short second
    sleep, 0 when the event beat the first, which corrects an overestimate at
    once); the next waits wake early, spin, and measure the wait exactly.

    Sleep slices are at most ``max_sleep_s``: Ctrl-C arrives within that (a
    signal also cuts the sleep short), and ``timeout`` is honoured.

    Args:
        history: wait durations remembered.
        quantile: which quantile of them predicts the next wait (low: wake early).
        min_samples: waits timed before predicting.
        jitter: share of the prediction added to the margin (device-time jitter).
        slack_s: seconds added to the margin.
        spin_s: shortest spin after waking (and before the first sleep without a prediction).
        fraction: sleep slice as a share of the time waited, once past the prediction.
        min_sleep_s: shortest sleep worth taking; shorter remaining times are spun.
        max_sleep_s: longest sleep slice (bounds Ctrl-C latency); at most 0.1.
        yield_gil: call ``os.sched_yield()`` between queries while spinning
            (~0.4 us), which releases the GIL to other Python threads (a
            DataLoader's pin-memory thread) and the CPU to other processes; a
            thread that then holds the GIL can delay the wake-up by up to the
            interpreter's switch interval (5 ms). Measured in BENCHMARKS.md.
        clock: monotonic clock in seconds.
        sleep: the sleep function.
    """

    blocking_events = False
    honours_timeout = True
    resumes = True

    def __init__(
        self,
        *,
        history: int = 16,
        quantile: float = 0.25,
        min_samples: int = 3,
        jitter: float = 0.02,
        slack_s: float = 2e-5,
        spin_s: float = 5e-5,
        fraction: float = 0.02,
        min_sleep_s: float = 2e-5,
        max_sleep_s: float = 0.05,
        yield_gil: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        _check_history(history, min_samples, quantile)
        _check_sleeps(min_sleep_s, max_sleep_s)
        check_real("jitter", jitter, low=0, rule=">= 0 (a share of the predicted wait)",
                   fix="e.g. jitter=0.02")
        for option, value in (("slack_s", slack_s), ("spin_s", spin_s)):
            check_real(option, value, low=0, rule=">= 0 (seconds)", fix=f"e.g. {option}=5e-5")
        _check_fraction(fraction)
        check_bool("yield_gil", yield_gil)
        self.quantile, self.min_samples = quantile, min_samples
        self.jitter, self.slack_s = jitter, slack_s
        self.spin_s, self.fraction = spin_s, fraction
        self.min_sleep_s, self.max_sleep_s = min_sleep_s, max_sleep_s
        self.yield_gil = yield_gil
        self._clock, self._sleep = _check_clock(clock), _check_sleep(sleep)
        # seconds from each call to seen complete
        self._waits: deque[float] = deque(maxlen=history)
        # Linux: ~70-100 us until measured
        self._overshoots: deque[float] = deque([1e-4], maxlen=8)

    def predict(self) -> float | None:
        """Seconds the next wait is expected to take, or None before ``min_samples`` waits."""
        return _low_quantile(self._waits, self.quantile, self.min_samples)

    @property
    def overshoot_s(self) -> float:
        """How late a sleep is expected to return: the second largest of the last 8 (one outlier
        ignored)."""
        ordered = sorted(self._overshoots)
        return ordered[-2] if len(ordered) > 1 else ordered[-1]

    def __call__(self, event: Event, timeout: float | None, waited: float = 0.0) -> bool:
        """``waited``: seconds this wait already lasted (a stall report interrupted it): it resumes
        where it was."""
        clock, query = self._clock, event.query
        now = clock()
        start = now - waited
        deadline = float("inf") if timeout is None else start + timeout
        predicted = self.predict()
        margin = self.overshoot_s + self.slack_s + self.jitter * (predicted or 0.0)
        # when the last sleep began (the event was unfinished then)
        slept_from: float | None = None
        # 1. sleep until shortly before the predicted completion
        if predicted is not None:
            wake = min(start + predicted - margin, deadline)
            # the last nap's length, at most
            approach = max(4 * self.overshoot_s, predicted / 8)
            while wake - now >= self.min_sleep_s and (
                now == start or wake - now > self.overshoot_s
            ):
                if query():
                    break
                slept_from = now
                # A long wait ends with a short nap, so that an event that completes in it leaves a
                # tight lower bound (see _done below).
                remaining = wake - now
                nap = remaining - approach if remaining > 2 * approach else remaining
                self._nap(min(nap, self.max_sleep_s))
                now = clock()
            # Done while the host slept: record the lower bound, so that an early wake measures it.
            if query():
                return self._done(start, clock() if slept_from is None else slept_from)
        # Resumed (waited > 0): it spun at its start already.
        spin = max(self.spin_s, 2 * margin if predicted is not None else 0.0) if not waited else 0.0
        spin_until = min(now + spin, deadline)
        yield_gil = self.yield_gil
        # 2. spin, briefly
        while not query():
            now = clock()
            if now >= spin_until:
                break
            if yield_gil:
                # releases the GIL to other Python threads
                os.sched_yield()
        else:
            return self._done(start, clock())
        # 3. the prediction was early (or absent): growing sleeps
        while not query():
            now = clock()
            if now >= deadline:
                return False
            nap = min(self.max_sleep_s, max(self.min_sleep_s, (now - start) * self.fraction),
                      deadline - now)
            self._nap(nap)
        return self._done(start, clock())

    def _nap(self, seconds: float) -> None:
        before = self._clock()
        self._sleep(seconds)
        self._overshoots.append(max(0.0, self._clock() - before - seconds))

    def _done(self, start: float, end: float) -> bool:
        self._waits.append(end - start)
        return True


_BY_NAME: dict[str, Callable[[], WaitStrategy]] = {
    "spin": Spin, "block": Block, "poll": Poll, "hybrid": Hybrid, "spin-block": SpinBlock,
}
# wait="auto" is chosen once the device is known (see auto_wait)
NAMES = sorted([*_BY_NAME, "auto"])


def _check_history(history: object, min_samples: object, quantile: object) -> None:
    """The options of a strategy that predicts a wait from the last ``history`` ones."""
    check_int("history", history, minimum=1, rule="an int >= 1 (waits remembered)",
              fix="e.g. history=16", none=False)
    check_int("min_samples", min_samples, minimum=1, rule="an int >= 1 (waits timed before "
              "predicting)", fix="e.g. min_samples=3", none=False)
    if min_samples > history:  # type: ignore[operator]
        raise ValueError(f"min_samples must be in [1, history], got {min_samples!r} with "
                         f"history={history!r}; raise history or lower min_samples")
    check_real("quantile", quantile, low=0, high=1, rule="in [0, 1]",
               fix="0.25 (the default) wakes early on a quarter of waits")


def _check_sleeps(min_sleep_s: object, max_sleep_s: object) -> None:
    check_real("max_sleep_s", max_sleep_s, low=0, high=0.1, low_open=True,
               rule="in (0, 0.1] (seconds: it bounds how late Ctrl-C arrives)",
               fix="e.g. max_sleep_s=0.002")
    check_real("min_sleep_s", min_sleep_s, low=0, high=max_sleep_s,  # type: ignore[arg-type]
               rule=f"in [0, max_sleep_s={max_sleep_s!r}] (seconds)", fix="e.g. min_sleep_s=1e-5")


def _check_fraction(fraction: object) -> None:
    check_real("fraction", fraction, low=0, low_open=True,
               rule="> 0 (a sleep slice's share of the time waited)", fix="e.g. fraction=0.02")


def _callable(option: str, value: Any, rule: str, fix: str) -> Any:
    """``value`` if it is a callable (None is refused too)."""
    if value is None:
        raise TypeError(f"{option} must be {rule}, got None; {fix}")
    return check_callable(option, value, rule=rule, fix=fix)


def _check_clock(clock: Any) -> Any:
    return _callable("clock", clock, "a callable returning seconds", "e.g. clock=time.perf_counter")


def _check_sleep(sleep: Any) -> Any:
    return _callable("sleep", sleep, "a callable taking seconds", "e.g. sleep=time.sleep")


def auto_wait(computes_on_host: bool, timeout: float | None) -> WaitStrategy:
    """``wait="auto"``: :class:`SpinBlock` where the device computes on the host's own cores (JAX's
    CPU backend) and no ``timeout`` must be honoured, else :class:`Hybrid`."""
    if computes_on_host and timeout is None:
        return SpinBlock()
    return Hybrid()


def resolve_wait(wait: str | WaitStrategy) -> WaitStrategy:
    """Turn ``wait=`` into a strategy object, or explain what is allowed (``"auto"`` is resolved by
    :func:`auto_wait`, once the device is known)."""
    if isinstance(wait, str):
        if wait not in _BY_NAME:
            raise ValueError(f"wait must be one of {NAMES} or a WaitStrategy, got {wait!r}")
        return _BY_NAME[wait]()
    if isinstance(wait, type):
        raise TypeError(
            f"wait={wait.__name__} is a class; pass an instance such as wait={wait.__name__}() "
            f"(or a name: one of {NAMES})"
        )
    if isinstance(wait, WaitStrategy):
        return wait
    raise TypeError(
        f"wait must be one of {NAMES} or an object with __call__(event, timeout), "
        f"blocking_events and honours_timeout, got {type(wait).__name__}"
    )
