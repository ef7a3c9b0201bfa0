"""The event protocol: the one thing the core knows about a device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Event(Protocol):
    """A marker in a device's work queue.

    Every backend (CUDA, MPS, XPU, ``torch.Event``, JAX, the test fakes) is a
    zero-argument factory returning objects of this shape. Optional methods:
    ``elapsed_time(end) -> ms`` (telemetry; if it raises, timing turns off),
    ``wait_stream(stream)`` (order the event after another CUDA stream's work,
    used for deferred copies made on side streams) and ``record_idle()``
    (record on a device known to be idle; backends that time from host
    observations, like JAX's, take the record time as the completion time).
    """

    def record(self) -> None:
        """Mark the end of the work enqueued so far. Must not block."""

    def query(self) -> bool:
        """Return True once all work before the marker has completed. Never blocks."""

    def synchronize(self) -> None:
        """Block the calling thread until ``query()`` would return True."""


EventFactory = Callable[[], Event]


class MultiEvent:
    """One step's events on several streams; complete when all of them are.

    Args:
        events: events that ``record()`` records in order (each on its own stream).
    """

    __slots__ = ("events",)

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = tuple(events)

    def record(self) -> None:
        for event in self.events:
            event.record()

    def query(self) -> bool:
        return all(event.query() for event in self.events)

    def synchronize(self) -> None:
        for event in self.events:
            event.synchronize()  # host-device sync: the caller asked to block.

    def wait_stream(self, stream: object) -> None:
        """Order the step after ``stream``'s work: the first (main) stream joins it when
        recorded."""
        join = getattr(self.events[0], "wait_stream", None)
        if join is not None:
            join(stream)

    def elapsed_time(self, end: MultiEvent) -> float:
        """Milliseconds between the first streams' markers (the main stream)."""
        return float(self.events[0].elapsed_time(end.events[0]))  # type: ignore[attr-defined]
