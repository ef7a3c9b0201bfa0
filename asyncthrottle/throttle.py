"""The Throttle: bounds how many minibatches are unfinished on the device."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .deferred import Deferred, start_copy
from .devices import device_kind, resolve_events
from .errors import ThrottleTimeout
from .events import Event, EventFactory
from .stats import Stats, verdict
from .syncdebug import sync_debug
from .telemetry import TimedSteps
from .waits import WaitStrategy, resolve_wait

if TYPE_CHECKING:
    from .view import Throttled

__all__ = ["Throttle"]

T = TypeVar("T")
OnComplete = Callable[[int, dict[str, Any]], None]
_HISTOGRAM_BUCKETS = 64  # in-flight histogram size when depth is None


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


def _check_sample_every(sample_every: object) -> int | None:
    if sample_every is None:
        return None
    if isinstance(sample_every, bool) or not isinstance(sample_every, int) or sample_every < 1:
        raise ValueError(f"sample_every must be an int >= 1 (time every k-th step) or None, got {sample_every!r}")
    return sample_every


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
        ...     loss = thr.defer(batch * 2, name="loss")  # with tensors: a non-blocking copy
        >>> thr.stats.steps, thr.latest["loss"]
        (3, 4)

    Args:
        depth: steps allowed in flight, an int >= 1, or None to only track.
        device: None auto-detects (an available accelerator, else the CPU);
            ``"cuda"``, ``"cuda:1"``, a ``torch.device``, ``"mps"``, ``"xpu"``,
            ``"jax"``, ``"cpu"``, or any device ``torch.Event`` supports. An
            explicit device that is not available raises ``RuntimeError``.
        events: a zero-argument factory of objects with ``record()``,
            ``query()``, ``synchronize()`` and optionally ``elapsed_time(end)``
            -- use it instead of ``device``.
        wait: ``"poll"`` (default), ``"spin"``, ``"block"`` or a
            :class:`~asyncthrottle.waits.WaitStrategy`. ``"poll"`` is the
            default because it matched ``"spin"``'s throughput at depth 1 in
            our benchmark (BENCHMARKS.md) while answering Ctrl-C within
            milliseconds and leaving the core free during long waits.
        timeout: seconds one wait may take before ``ThrottleTimeout``; None waits
            for ever. Needs ``"poll"`` or ``"spin"``.
        drain: wait for every step at the end of a wrapped iteration.
        streams: record on these streams (one event each) instead of the
            device's current stream; use it when work runs on side streams.
        sample_every: time every k-th step on the device with timing events
            (None: no device timing). See :class:`~asyncthrottle.Stats`.
        detect_sync: ``"warn"`` or ``"error"`` turns on CUDA's sync debug mode
            for the loop body only, so hidden syncs (``.item()``, ``print``) are
            reported; elsewhere it warns once that it cannot.
        clock: the clock that times the host (tests inject a fake one).

    Host-device syncs: the only ones are the waits the depth rule requires,
    ``drain()`` and ``Deferred.get()`` on an unfinished step; everything else
    only records or queries events.
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
        sample_every: int | None = 8,
        detect_sync: str | None = None,
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
        self._resolve_events(device, events, streams, _check_sample_every(sample_every))
        self._sync_guard = sync_debug(detect_sync, None if events is not None else device_kind(device))
        self._limit = None if self._depth is None else self._depth - 1
        self._clock = clock
        self._pending: deque[Event] = deque()
        self._steps = self._completed = self._max_in_flight = self._waits = self._starved = 0
        self._wait_s = self._fetch_s = 0.0
        self._t_first: float | None = None
        self._t_last = 0.0
        self._histogram = [0] * ((self._depth or _HISTOGRAM_BUCKETS - 1) + 1)
        self._deferred: dict[int, list[Deferred]] = {}
        self._latest: dict[str, Any] = {}
        self._callbacks: list[OnComplete] = []
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread running a wrapped pass
        self._in_step = False

    def _resolve_events(self, device: Any, events: EventFactory | None, streams: Any, every: int | None) -> None:
        if events is None:
            blocking = self._wait.blocking_events
            self._new_event = resolve_events(device, streams=streams, blocking=blocking)
            timed = resolve_events(device, streams=streams, blocking=blocking, timing=True) if every else None
        else:
            if device is not None or streams is not None:
                raise ValueError("pass events= or device=/streams=, not both: events= replaces the device backend")
            if not callable(events):
                raise TypeError(f"events must be a zero-argument callable returning an event, got {events!r}")
            self._new_event = timed = events
        self._new_timed_event = timed if self._new_event is not None else None
        self._timed = TimedSteps(every) if every and self._new_timed_event is not None else None
        self._timing_ok: bool | None = None if events is not None else True  # events=: unknown until used

    # -- public API -------------------------------------------------------

    @property
    def depth(self) -> int | None:
        """Steps allowed in flight (None: unbounded, tracking only)."""
        return self._depth

    @property
    def synchronous(self) -> bool:
        """True when the backend runs work synchronously (the CPU): nothing is ever waited for."""
        return self._new_event is None

    def wrap(self, iterable: Iterable[T], *, progress: Any = False) -> Throttled[T]:
        """An iterable view of ``iterable`` throttled by this object (see :func:`throttle`)."""
        from .view import Throttled

        return Throttled(self, iterable, progress=progress)

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
            now = self._clock()
            self._begin(now)
            self._record(now)
            self._admit()

    def drain(self) -> None:
        """Wait for every recorded step (a host-device sync for the last one)."""
        with self._exclusive("drain()", inside_pass=True):
            if self._completed < self._steps:
                self._wait_until(self._steps - 1)
                self._t_last = max(self._t_last, self._clock())  # the drain is part of the loop's time

    def defer(self, value: Any, name: str | None = None) -> Deferred:
        """Copy ``value`` from the current step to the host without a sync; read it when the step completes.

        ``value`` is a tensor, a JAX array, or a nested dict/list/tuple of them.
        The copy is non-blocking (pinned memory on CUDA) and enqueued before the
        step's event, so it is complete when the step is.

        Args:
            value: the step's value, e.g. the loss.
            name: the key in :attr:`latest` and in ``on_complete`` callbacks
                (default ``"value"``, or ``"value_<k>"`` for the k-th unnamed one).
        """
        step = self._steps
        pending = self._deferred.setdefault(step, [])
        if name is None:
            name = "value" if not pending else f"value_{len(pending)}"
        deferred = Deferred(step, name, start_copy(value), self._is_complete, self._wait_until)
        pending.append(deferred)
        return deferred

    def on_complete(self, callback: OnComplete) -> OnComplete:
        """Call ``callback(step, values)`` for every step, in order, once it is seen complete.

        ``values`` maps names to the step's deferred values on the host. The
        callback runs on the loop's thread during the throttle's own
        bookkeeping (or ``drain()``): logging a loss every step adds no sync.
        Returns ``callback``, so it works as a decorator.
        """
        if not callable(callback):
            raise TypeError(f"on_complete needs a callable(step, values), got {callback!r}")
        self._callbacks.append(callback)
        return callback

    @property
    def latest(self) -> dict[str, Any]:
        """The most recent completed value of each deferred name. Never blocks."""
        return dict(self._latest)

    @property
    def in_flight(self) -> int:
        """Recorded steps whose events do not report completion. Queries, never blocks."""
        pending = tuple(self._pending)  # a copy: safe to read from any thread
        return sum(1 for event in pending if not event.query())

    @property
    def stats(self) -> Stats:
        """A snapshot of the counters and telemetry; never blocks or syncs."""
        steps, sync = self._steps, self._new_event is None
        completed = steps if sync else self._completed
        wall = self._t_last - self._t_first if self._t_first is not None else 0.0
        handouts = sum(self._histogram)
        fetch = min(self._fetch_s, wall)
        body = max(0.0, wall - fetch - self._wait_s)
        shares = [x / wall if wall > 0 else 0.0 for x in (self._wait_s, fetch, body)]
        starved = self._starved / handouts if handouts else 0.0
        device = self._timed.times.fields(completed) if self._timed is not None else {}
        return Stats(
            steps=steps,
            completed=completed,
            in_flight=steps - completed,
            max_in_flight=min(steps, 1) if sync else self._max_in_flight,
            waits=self._waits,
            wait_s=self._wait_s,
            wall_s=wall,
            wait_fraction=shares[0],
            fetch_s=fetch,
            body_s=body,
            steps_per_s=steps / wall if wall > 0 else 0.0,
            starved_fraction=starved,
            in_flight_histogram=tuple(self._histogram),
            verdict=verdict(steps, shares[0], shares[1], shares[2], starved),
            **device,
        )

    def summary(self) -> str:
        """A short human-readable report of :attr:`stats`."""
        return self.stats.summary()

    def __repr__(self) -> str:
        return f"Throttle(depth={self._depth}, steps={self._steps}, in_flight<={self._steps - self._completed})"

    # -- the depth rule ---------------------------------------------------

    def _record(self, now: float) -> None:
        """End of a step: one event, recorded after the step's work was enqueued."""
        self._t_last = now
        step = self._steps
        if self._new_event is None:  # synchronous: the step is complete as it ends
            self._steps = step + 1
            self._completed = step + 1
            if self._deferred or self._callbacks:
                self._finish(step)
            return
        timed = self._timed
        if timed is not None and timed.wants_end(step):
            event = self._new_timed_event()  # type: ignore[misc]
            event.record()  # may raise (CUDA graph capture): then the step is not counted
            if self._check_timing(event):
                timed.ends[step] = event
        else:
            event = self._new_event()
            event.record()
        self._steps = step + 1
        pending = self._pending
        pending.append(event)
        if len(pending) > self._max_in_flight:
            self._max_in_flight = len(pending)

    def _admit(self) -> None:
        """Before a step: wait until at most depth - 1 steps are in flight."""
        if self._new_event is None:
            return
        pending = self._pending
        limit = self._limit
        if limit is not None:
            while len(pending) > limit:
                self._wait_front()
        while pending and pending[0].query():  # retire finished steps without blocking
            self._retire()
        queued = len(pending)
        histogram = self._histogram
        histogram[min(queued, len(histogram) - 1)] += 1
        if not queued:
            self._starved += 1
            timed = self._timed
            if timed is not None and self._timing_ok and timed.wants_start(self._steps):
                marker = self._new_timed_event()  # type: ignore[misc]
                marker.record()  # the device is idle: this marks when the step is handed out
                timed.starts[self._steps] = marker

    def _check_timing(self, event: Event) -> bool:
        """Whether the backend's events can be timed; the first timed event decides, for good."""
        if self._timing_ok is None:
            self._timing_ok = hasattr(event, "elapsed_time")
            if not self._timing_ok:
                self._timed = None
        return self._timing_ok

    def _wait_front(self) -> None:
        self._wait_for(self._completed)
        self._retire()

    def _wait_for(self, step: int) -> None:
        """Block until recorded step ``step``'s event completes (nothing else is waited for)."""
        event = self._pending[step - self._completed]
        if event.query():
            return
        start = self._clock()
        done = False
        try:
            done = self._wait(event, self._timeout)  # host-device sync, required by the rule or the caller
        finally:  # an interrupted wait (Ctrl-C) still counts
            waited = self._clock() - start
            self._waits += 1
            self._wait_s += waited
        if not done:
            assert self._timeout is not None
            raise ThrottleTimeout(step, self._depth, waited, self._timeout)

    def _retire(self) -> None:
        self._pending.popleft()
        step = self._completed
        self._completed = step + 1
        timed = self._timed
        if (timed is not None and timed.ends) or self._deferred or self._callbacks:  # most steps: nothing to do
            self._finish(step)

    def _finish(self, step: int) -> None:
        """Step ``step`` is complete: read its timing, resolve its values, call back. Never blocks."""
        if self._timed is not None:
            self._timed.complete(step)
        values = {}
        for deferred in self._deferred.pop(step, ()):
            values[deferred.name] = self._latest[deferred.name] = deferred.get()
        for callback in self._callbacks:
            callback(step, values)

    def _is_complete(self, step: int) -> bool:
        if step < self._completed:
            return True
        if step >= self._steps:
            return False
        return self._pending[step - self._completed].query()

    def _wait_until(self, step: int) -> None:
        """Wait for ``step`` and every step before it (no later step)."""
        if step >= self._steps:
            raise RuntimeError(
                f"step {step} has not ended yet (its event is recorded when the loop moves on): read "
                "deferred values after their step, e.g. in on_complete, thr.latest, or a later step"
            )
        if self._completed <= step:
            self._wait_for(step)  # one wait: on an in-order queue the steps before it are done too
        while self._completed <= step:
            self._wait_front()

    # -- the entry points -------------------------------------------------

    def _begin(self, now: float) -> None:
        if self._t_first is None:
            self._t_first = now

    def _iterate(self, iterable: Iterable[T]) -> Iterator[T]:
        """The wrapped loop: record step n, fetch n+1, wait for room, hand it out."""
        self._claim_pass()
        try:
            clock, admit, record, guard = self._clock, self._admit, self._record, self._sync_guard
            asynchronous = self._new_event is not None  # a synchronous backend never waits: skip the call
            then = clock()
            self._begin(then)
            for item in iterable:  # the fetch comes before the wait: loading overlaps the device
                self._fetch_s += clock() - then
                if asynchronous:
                    admit()
                if guard is None:
                    yield item  # a break or an exception here leaves without blocking
                else:
                    with guard:  # hidden-sync detection covers the loop body only
                        yield item
                then = clock()
                record(then)
            self._fetch_s += clock() - then
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
            now = self._clock()
            self._begin(now)
            self._fetch_s += now - self._t_last if self._steps else 0.0
            self._admit()
            if self._sync_guard is not None:
                self._sync_guard.__enter__()
            self._in_step = True
            return self._steps

    def _exit_step(self, failed: bool) -> None:
        with self._exclusive("step()"):
            self._in_step = False
            if self._sync_guard is not None:
                self._sync_guard.__exit__()
            if not failed:
                self._record(self._clock())


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
