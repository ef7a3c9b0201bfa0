"""The reference loops the throttle's per-step cost is held to: a 10-line generator and a 15-line
event ring."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from ..core.events import Event, EventFactory

__all__ = ["Reference", "generator_throttle"]

T = TypeVar("T")


class Reference(Generic[T]):
    """What a careful user writes by hand instead of a throttle; the bench measures both in one run.

    Iterating hands out the items of ``iterable`` with at most ``depth`` steps
    unfinished, exactly as the depth rule says: before step ``n`` the event of
    step ``n - depth`` is queried, and synchronized if it is not complete; at
    the end every step is waited for. The ``depth + 1`` events are made once
    and re-recorded in turn (at most ``depth`` are ever pending). No
    telemetry, no deferred values, no interruptible waits: the bare cost of
    pacing, the bar the throttle's per-step cost is held to.

    Args:
        iterable: the steps' data.
        new_event: the backend's event factory (called ``depth + 1`` times).
        depth: steps allowed in flight (an int >= 1).
        clock: host clock, for ``wait_s``.

    Attributes:
        max_in_flight: most steps recorded and not waited for.
        wait_s: seconds the host spent in ``synchronize()``.
        pending: the events of recorded steps not waited for yet.
    """

    def __init__(
        self, iterable: Iterable[T], new_event: EventFactory, depth: int, *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"the reference loop needs an int depth >= 1, got {depth!r}")
        self.iterable, self.new_event, self.depth, self.clock = iterable, new_event, depth, clock
        self.max_in_flight = 0
        self.wait_s = 0.0
        # recorded steps not waited for yet
        self.pending: deque[Event] = deque()

    def __iter__(self) -> Iterator[T]:
        depth, slots = self.depth, self.depth + 1
        ring = [self.new_event() for _ in range(slots)]
        pending = self.pending
        for i, item in enumerate(self.iterable):
            # the bound: step i - depth completes before step i starts
            while len(pending) >= depth:
                self._wait(pending.popleft())
            yield item
            event = ring[i % slots]
            event.record()
            pending.append(event)
            if len(pending) > self.max_in_flight:
                self.max_in_flight = len(pending)
        # the end: every step
        while pending:
            self._wait(pending.popleft())

    def _wait(self, event: Event) -> None:
        if not event.query():
            start = self.clock()
            event.synchronize()  # host-device sync: the bound (or the end) requires this step
            self.wait_s += self.clock() - start


def generator_throttle(iterable: Iterable[T], new_event: EventFactory, depth: int) -> Iterator[T]:
    """The 10-line generator throttle: a new event per step, a deque, a query of the oldest.

    What the issue tracker measured the throttle against (``bench --overhead`` prints both): the
    same events as the throttle (one made and recorded per step), finished steps dropped from the
    front, the oldest synchronized when ``depth`` are pending. Nothing else.
    """
    pending: deque[Event] = deque()
    for item in iterable:
        while pending and (len(pending) >= depth or pending[0].query()):
            oldest = pending.popleft()
            if not oldest.query():
                oldest.synchronize()  # host-device sync: the bound requires this step
        yield item
        event = new_event()
        event.record()
        pending.append(event)
    while pending:
        pending.popleft().synchronize()  # host-device sync: the end of the pass
