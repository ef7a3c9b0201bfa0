"""The part that delivers each step's deferred values, in step order, once the step completes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .deferred import Deferred, snapshot
from .events import Event

if TYPE_CHECKING:
    from .core import Core

__all__ = ["Completions", "OnComplete"]

OnComplete = Callable[[int, dict[str, Any]], None]


class Completions:
    """Deferred values and ``on_complete`` callbacks; subscribes to the core on first use.

    A value belongs to the step the host is in when it is deferred. Its step's
    event is attached when the step is recorded; when the core retires the
    step, its values go to :attr:`latest` and to every callback. The values of
    a step that ended without an event (its body raised, or its record failed)
    are dropped with it (:meth:`on_drop`): their ``get()`` says so.

    A name deferred more than once in a step (gradient accumulation) keeps
    every value: it maps to the list of them, in order.

    Args:
        core: the throttle's core.
        wait: how ``Deferred.get()`` waits for an unfinished step.
    """

    def __init__(self, core: Core, wait: Callable[[Deferred], None]) -> None:
        self.core, self._wait = core, wait
        self.open: list[Deferred] = []  # the current step's values, until it is recorded
        self.streams: list[Any] = []  # CUDA streams the current step's copies were enqueued on
        self.recorded: deque[tuple[int, list[Deferred]]] = deque()  # recorded steps' values, until retired
        self.latest: dict[str, Any] = {}
        self.callbacks: list[OnComplete] = []
        self._subscribed = False

    def defer(self, value: Any, name: str | None) -> Deferred:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"defer() name must be a str or None, got {name!r}")
        self._subscribe()
        unnamed = name is None
        open_ = self.open
        taken = {deferred.name for deferred in open_}
        if name is None:  # "value", then "value_1", ...: the first default name no value of the step has
            k = sum(1 for deferred in open_ if deferred.unnamed)
            name = "value" if not k else f"value_{k}"
            while name in taken:
                k += 1
                name = f"value_{k}"
        elif name in taken and any(deferred.unnamed and deferred.name == name for deferred in open_):
            raise ValueError(
                f"defer(name={name!r}): an unnamed value of this step already has the default name {name!r}; "
                "name that value too, or pick another name"
            )
        host, streams = snapshot(value, synchronous=self.core.synchronous)
        self.streams.extend(stream for stream in streams if stream not in self.streams)
        deferred = Deferred(self.core.steps, name, host, self._wait, unnamed=unnamed)
        open_.append(deferred)
        return deferred

    def add(self, callback: OnComplete) -> None:
        if not callable(callback):
            raise TypeError(f"on_complete needs a callable(step, values), got {callback!r}")
        self._subscribe()
        self.callbacks.append(callback)

    def remove(self, callback: OnComplete) -> None:
        try:
            self.callbacks.remove(callback)
        except ValueError:
            raise ValueError(f"{callback!r} is not registered with on_complete(); nothing to remove") from None

    def on_drop(self, step: int) -> None:
        """The current step ended without an event: its values will never arrive (``get()`` says so)."""
        for deferred in self.open:
            deferred._dropped = True
        self.open, self.streams = [], []

    # -- the core's notifications -----------------------------------------------

    def before_record(self, step: int, event: Event) -> None:
        """Order the step's event after the copies enqueued on other CUDA streams."""
        join = getattr(event, "wait_stream", None) if self.streams else None
        if join is not None:
            for stream in self.streams:
                join(stream)

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        values, self.open, self.streams = self.open, [], []
        for deferred in values:
            deferred._recorded(event)
        self.recorded.append((step, values))

    def on_retire(self, step: int) -> None:
        """``step`` is complete: its values go to ``latest`` and the callbacks. Never blocks."""
        recorded = self.recorded
        deferreds = recorded.popleft()[1] if recorded and recorded[0][0] == step else ()
        gathered: dict[str, list[Any]] = {}
        for deferred in deferreds:
            deferred._done = True
            deferred._event = None  # a value kept by the user does not keep its step's event from reuse
            gathered.setdefault(deferred.name, []).append(deferred.get())  # the step is complete: no wait
        values = {name: found[0] if len(found) == 1 else found for name, found in gathered.items()}
        self.latest.update(values)
        error: Exception | None = None
        for callback in tuple(self.callbacks):  # a copy: a callback may remove itself or another
            try:
                callback(step, values)
            except Exception as exc:  # every callback sees every step; the first error is raised after
                error = error or exc
        if error is not None:
            raise error

    def _subscribe(self) -> None:
        if not self._subscribed:
            self._subscribed = True
            self.core.subscribe(self)

