"""Test doubles for the depth-rule tests: scripted events that log every call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from asyncthrottle import Throttle
from asyncthrottle._lifecycle import of
from asyncthrottle.testing import FakeDevice, FakeEvent


class Log(list[tuple[str, int]]):
    """An ordered record of what the host and the events did."""


class ScriptedEvent:
    """Completes when ``clock[0] >= ready_at`` or when synchronized; logs every call."""

    def __init__(self, index: int, ready_at: float, clock: list[float], log: Log) -> None:
        self.index, self.ready_at, self.clock, self.log = index, ready_at, clock, log
        self.recorded = 0
        self.synced = False

    def record(self) -> None:
        self.recorded += 1
        self.log.append(("record", self.index))

    def complete(self) -> bool:
        return self.synced or self.clock[0] >= self.ready_at

    def query(self) -> bool:
        return self.complete()

    def synchronize(self) -> None:
        self.log.append(("sync", self.index))
        self.synced = True


class Script:
    """A factory of scripted events: event i becomes ready at ``ready_at[i]``."""

    def __init__(self, ready_at: list[float]) -> None:
        self.ready_at = ready_at
        self.clock = [0.0]
        self.log = Log()
        self.events: list[ScriptedEvent] = []

    def __call__(self) -> ScriptedEvent:
        i = len(self.events)
        ready = self.ready_at[i] if i < len(self.ready_at) else float("inf")
        event = ScriptedEvent(i, ready, self.clock, self.log)
        self.events.append(event)
        return event

    def source(self, n: int) -> Iterator[int]:
        for i in range(n):
            self.log.append(("fetch", i))
            yield i


class FakeTorchEvent:
    """Stands in for torch.cuda.Event: remembers how it was made and where it was recorded."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.stream: Any = "current"
        FakeTorchEvent.made.append(kwargs)

    def record(self, stream: Any = "current") -> None:
        self.stream = stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeTorchEvent) -> float:
        return 1.0


class CountingTorchEvent(FakeEvent):
    """Stands in for ``torch.Event`` on a :class:`FakeDevice`: counts creations and records.

    Set ``device`` (the FakeDevice) before the first event is made; ``made``
    lists every event made, ``guard(event)`` runs before each record (a test
    raises there if something still refers to the event).
    """

    device: ClassVar[FakeDevice]
    made: ClassVar[list[CountingTorchEvent]] = []
    guard: ClassVar[Callable[[CountingTorchEvent], None] | None] = None

    __slots__ = ("kwargs", "records", "step")

    def __init__(self, device: Any = None, **kwargs: Any) -> None:
        super().__init__(CountingTorchEvent.device)
        self.kwargs = {"device": device, **kwargs}
        self.records = 0
        self.step = -1  # set by tests that track which step an event marks
        CountingTorchEvent.made.append(self)

    def record(self, stream: Any = "current") -> None:  # type: ignore[override]
        if CountingTorchEvent.guard is not None:
            CountingTorchEvent.guard(self)
        self.records += 1
        super().record()

    @classmethod
    def reset(cls, device: FakeDevice) -> None:
        cls.device, cls.made, cls.guard = device, [], None


class Internals:
    """The one way tests read a throttle's internals (its core, its values, its parts)."""

    def __init__(self, throttle: Any) -> None:
        self.life = of(throttle)  # the throttle's Lifecycle, by the package's own named call

    @property
    def core(self) -> Any:
        return self.life.core

    @property
    def values(self) -> Any:
        return self.life.values

    @property
    def copies(self) -> Any:
        """The ring copies of deferred CUDA/XPU tensors (``.ring``, ``.model``: made at the first one)."""
        return self.life.values.copies

    @property
    def host(self) -> Any:
        return self.life.host

    def part(self, kind: type) -> Any:
        """The throttle's part of class ``kind``, or None when its options leave it off."""
        return self.life.part(kind)


def inside(throttle: Any) -> Internals:
    """``inside(thr).core``, ``inside(thr).part(StallWatch)``: internals, read in one place."""
    view = getattr(throttle, "throttle", None)  # a Throttled view: its throttle
    return Internals(view if isinstance(view, Throttle) else throttle)
