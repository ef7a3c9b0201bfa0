"""The Throttle: bounds how many minibatches are unfinished on the device."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .devices import resolve_events
from .errors import ThrottleTimeout
from .events import Event, EventFactory
from .stats import Stats
from .waits import WaitStrategy, resolve_wait

if TYPE_CHECKING:
    from .view import Throttled

__all__ = ["Throttle"]

T = TypeVar("T")


def _check_depth(depth: object) -> int | None:
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"depth must be an int >= 1 or None, got {depth!r} ({type(depth).__name__})")
    if depth < 1:
        raise ValueError(f"depth must be an int >= 1 or None, got {depth!r}; depth=1 syncs once per step")
    return depth


def _check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    if not timeout > 0:  # also rejects NaN
        raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


class _StepContext:
    """``with throttle.step():`` -- enter waits for room, a clean exit records."""

    __slots__ = ("_throttle",)

    def __init__(self, throttle: Throttle) -> None:
        self._throttle = throttle

    def __enter__(self) -> int:
        return self._throttle._enter_step()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._throttle._exit_step(failed=exc_type is not None)


class Throttle:
    """Blocks the host when more than ``depth`` minibatches are unfinished on the device.

    One event is recorded at the end of each step. Before the host starts step
    ``n``, every step ``<= n - depth`` has completed; no later step is ever
    waited for, except by ``drain()``. ``depth=1`` is "synchronise once per
    minibatch"; ``depth=2`` is what FSDP and MaxText use.

    Example:
        >>> thr = Throttle(depth=2, device="cpu")
        >>> for batch in thr.wrap(range(3)):
        ...     pass
        >>> thr.stats.steps
        3

    Args:
        depth: steps allowed in flight, an int >= 1, or None to only track.
        device: None auto-detects (an available accelerator, else the CPU);
            ``"cuda"``, ``"cuda:1"``, a ``torch.device``, ``"mps"``, ``"xpu"``,
            ``"cpu"``, or any device ``torch.Event`` supports. An explicit
            device that is not available raises ``RuntimeError``.
        events: a zero-argument factory of objects with ``record()``,
            ``query()`` and ``synchronize()`` -- use it instead of ``device``.
        wait: ``"poll"`` (default), ``"spin"``, ``"block"`` or a
            :class:`~asyncthrottle.waits.WaitStrategy`. ``"poll"`` is the
            default because it reached 99-100 % of ``"spin"``'s throughput at
            depth 1 in our benchmark (BENCHMARKS.md) while answering Ctrl-C
            within 2 ms and leaving the core free during long waits.
        timeout: seconds one wait may take before ``ThrottleTimeout``; None waits
            for ever. Needs an interruptible wait (``"poll"`` or ``"spin"``).
        drain: wait for every step at the end of a wrapped iteration.
        streams: record on these streams (one event each) instead of the
            device's current stream; use it when work runs on side streams.
        clock: the clock that times waits (tests inject a fake one).

    Host-device syncs: the only ones are the waits the depth rule requires and
    ``drain()``; everything else only records or queries events.
    """

    def __init__(
        self,
        depth: int | None = 2,
        *,
        device: Any = None,
        events: EventFactory | None = None,
        wait: str | WaitStrategy = "poll",
        timeout: float | None = None,
        drain: bool = True,
        streams: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._depth = _check_depth(depth)
        self._timeout = _check_timeout(timeout)
        if not isinstance(drain, bool):
            raise TypeError(f"drain must be True or False, got {drain!r}")
        self._drain_at_end = drain
        self._wait = resolve_wait(wait)
        if self._timeout is not None and not self._wait.honours_timeout:
            raise ValueError(f"timeout={timeout!r} cannot interrupt wait={wait!r}; use wait='poll' or 'spin'")
        self._new_event = self._resolve_events(device, events, streams)
        self._limit = None if self._depth is None else self._depth - 1
        self._clock = clock
        self._pending: deque[Event] = deque()
        self._steps = self._completed = self._max_in_flight = self._waits = 0
        self._wait_s = 0.0
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread running a wrapped pass
        self._in_step = False

    def _resolve_events(self, device: Any, events: EventFactory | None, streams: Any) -> EventFactory | None:
        if events is None:
            return resolve_events(device, streams=streams, blocking=self._wait.blocking_events)
        if device is not None or streams is not None:
            raise ValueError("pass events= or device=/streams=, not both: events= replaces the device backend")
        if not callable(events):
            raise TypeError(f"events must be a zero-argument callable returning an event, got {events!r}")
        return events

    # -- public API -------------------------------------------------------

    @property
    def depth(self) -> int | None:
        """Steps allowed in flight (None: unbounded, tracking only)."""
        return self._depth

    @property
    def synchronous(self) -> bool:
        """True when the backend runs work synchronously (the CPU): nothing is ever waited for."""
        return self._new_event is None

    def wrap(self, iterable: Iterable[T]) -> Throttled[T]:
        """An iterable view of ``iterable`` throttled by this object (see :func:`throttle`)."""
        from .view import Throttled

        return Throttled(self, iterable)

    def step(self) -> _StepContext:
        """A context manager for one step: enter waits for room, a clean exit records the event.

        An exception inside the block records nothing and blocks on nothing.
        Entering returns the step's number.
        """
        return _StepContext(self)

    def mark(self) -> None:
        """End the current step: record its event, then wait until the next step may start.

        For loops that cannot use ``step()``. Unlike the wrapper, the next batch
        is fetched after the wait, so data loading does not overlap it.
        """
        with self._exclusive("mark()"):
            self._record()
            self._admit()

    def drain(self) -> None:
        """Wait for every recorded step (a host-device sync for the last one)."""
        with self._exclusive("drain()", inside_pass=True):
            while self._pending:
                self._wait_front()

    @property
    def in_flight(self) -> int:
        """Recorded steps whose events do not report completion. Queries, never blocks."""
        pending = tuple(self._pending)  # a copy: safe to read from any thread
        return sum(1 for event in pending if not event.query())

    @property
    def stats(self) -> Stats:
        """A snapshot of the counters; never blocks or syncs."""
        completed = self._steps if self._new_event is None else self._completed
        return Stats(
            steps=self._steps,
            completed=completed,
            in_flight=self._steps - completed,
            max_in_flight=min(self._steps, 1) if self._new_event is None else self._max_in_flight,
            waits=self._waits,
            wait_s=self._wait_s,
        )

    def __repr__(self) -> str:
        return f"Throttle(depth={self._depth}, steps={self._steps}, in_flight<={self._steps - self._completed})"

    # -- the depth rule ---------------------------------------------------

    def _record(self) -> None:
        """End of a step: one event, recorded after the step's work was enqueued."""
        if self._new_event is None:
            self._steps += 1
            return
        event = self._new_event()
        event.record()  # may raise (CUDA graph capture): then the step is not counted
        self._steps += 1
        pending = self._pending
        pending.append(event)
        if len(pending) > self._max_in_flight:
            self._max_in_flight = len(pending)

    def _admit(self) -> None:
        """Before a step: wait until at most depth - 1 steps are in flight."""
        pending = self._pending
        limit = self._limit
        if limit is not None:
            while len(pending) > limit:
                self._wait_front()
        while pending and pending[0].query():  # retire finished steps without blocking
            pending.popleft()
            self._completed += 1

    def _wait_front(self) -> None:
        event = self._pending[0]
        if not event.query():
            start = self._clock()
            done = False
            try:
                done = self._wait(event, self._timeout)  # host-device sync, required by the depth rule
            finally:  # an interrupted wait (Ctrl-C) still counts
                waited = self._clock() - start
                self._waits += 1
                self._wait_s += waited
            if not done:
                assert self._timeout is not None
                raise ThrottleTimeout(self._completed, self._depth, waited, self._timeout)
        self._pending.popleft()
        self._completed += 1

    # -- the entry points -------------------------------------------------

    def _iterate(self, iterable: Iterable[T]) -> Iterator[T]:
        """The wrapped loop: record step n, fetch n+1, wait for room, hand it out."""
        self._claim_pass()
        try:
            if self._new_event is None:  # synchronous backend: just count
                for item in iterable:
                    yield item
                    self._steps += 1
            else:
                admit, record = self._admit, self._record
                for item in iterable:  # the fetch comes before the wait: loading overlaps the device
                    admit()
                    yield item  # a break or an exception here leaves without blocking
                    record()
            if self._drain_at_end:
                self.drain()
        finally:
            self._owner = None

    def _claim_pass(self) -> None:
        me = threading.get_ident()
        if self._owner is not None:
            where = "this thread" if self._owner == me else f"thread {self._owner}"
            raise RuntimeError(
                f"this Throttle is already running a wrapped loop in {where}; finish or break out of "
                "that loop first, or give each loop its own Throttle"
            )
        if self._in_step:
            raise RuntimeError("cannot start a wrapped loop inside `with throttle.step():`")
        self._owner = me

    def _exclusive(self, what: str, inside_pass: bool = False) -> _Exclusive:
        owner = self._owner
        if owner is not None and (owner != threading.get_ident() or not inside_pass):
            raise RuntimeError(
                f"{what} was called while a wrapped loop over this Throttle is running"
                + ("" if owner == threading.get_ident() else f" in thread {owner}")
                + "; the wrapper already records and waits for each step -- use one or the other"
            )
        return _Exclusive(self._lock, what)

    def _enter_step(self) -> int:
        with self._exclusive("step()"):
            if self._in_step:
                raise RuntimeError("step() is not reentrant: a `with throttle.step():` block is already open")
            self._admit()
            self._in_step = True
            return self._steps

    def _exit_step(self, failed: bool) -> None:
        with self._exclusive("step()"):
            self._in_step = False
            if not failed:
                self._record()


class _Exclusive:
    """Holds the throttle's lock for one call; a second thread gets an error, not a race."""

    __slots__ = ("_lock", "_what")

    def __init__(self, lock: threading.Lock, what: str) -> None:
        self._lock, self._what = lock, what

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                f"{self._what} was called while another thread is using this Throttle; "
                "a Throttle serves one loop in one thread -- give each thread its own"
            )

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
