"""Deferred values: snapshots of a step's values on their way to the host, delivered in step order once it completes."""

from __future__ import annotations

import dataclasses
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .core.events import Event

if TYPE_CHECKING:
    from .core.rule import Core

OnComplete = Callable[[int, dict[str, Any]], None]


def _map(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to every leaf of its mappings, lists, tuples, namedtuples and dataclasses.

    A mapping keeps its type where the type can be built from a dict
    (``OrderedDict``, transformers' ``BatchEncoding``); others become a dict.
    """
    if isinstance(value, Mapping):
        mapped = {key: _map(item, leaf) for key, item in value.items()}
        if type(value) is dict:
            return mapped
        rebuild: Any = type(value)
        try:
            return rebuild(mapped)
        except Exception:  # e.g. a defaultdict, whose first argument is its factory
            return mapped
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, leaf) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # an instance, not the class
        fields = {f.name: _map(getattr(value, f.name), leaf) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    return leaf(value)


class Snapshot:
    """Copies the leaves of one value; remembers the CUDA streams the copies were enqueued on.

    Args:
        synchronous: the throttle runs synchronously (no event orders the
            copies), so a copy from a device blocks until it is done.
    """

    __slots__ = ("streams", "synchronous")

    def __init__(self, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.streams: list[Any] = []

    def __call__(self, value: Any) -> Any:
        torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
        if torch is not None and isinstance(value, torch.Tensor):
            return self._tensor(torch, value.detach())
        if hasattr(value, "copy_to_host_async"):  # a JAX array
            return _jax_copy(value)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            return value.copy()  # a snapshot: the caller may update the array in place
        return value

    def _tensor(self, torch: Any, tensor: Any) -> Any:
        if tensor.device.type == "cpu":
            return tensor.clone()  # a snapshot: the caller may update the tensor in place
        if self.synchronous:
            return tensor.to("cpu")  # host-device sync: nothing orders a non-blocking copy on this throttle
        if tensor.device.type == "cuda":
            self.streams.append(torch.cuda.current_stream(tensor.device))  # joined before the step's event
        # Non-blocking device-to-host copy into pinned memory, enqueued before the step's event.
        return tensor.to("cpu", non_blocking=True)


def _jax_copy(array: Any) -> Any:
    """A device copy of ``array`` on its way to the host: the step may donate the original."""
    copy = array.copy() if hasattr(array, "copy") else array  # dispatched, never blocks
    copy.copy_to_host_async()
    return copy


def snapshot(value: Any, synchronous: bool = False) -> tuple[Any, list[Any]]:
    """Start copying ``value`` (tensors, arrays, nested dicts/lists/tuples) to the host.

    Returns the copy and the CUDA streams its copies were enqueued on.
    """
    copier = Snapshot(synchronous)
    return _map(value, copier), copier.streams


def _host_leaf(value: Any) -> Any:
    if hasattr(value, "copy_to_host_async"):
        import numpy as np

        return np.asarray(value)  # the step is complete: this does not wait
    return value


class Deferred:
    """A value from one step, readable once that step is complete.

    ``ready()`` never blocks. ``get()`` waits for this value's step only --
    never for a later step, never a device-wide sync. Both are safe from any
    thread: from the loop's thread the wait counts as host wait in the
    throttle's stats; from another thread it waits on the step's own event
    and changes nothing in the throttle.

    Attributes:
        step: the step the value belongs to.
        name: its name in ``Throttle.latest`` and ``on_complete`` callbacks.
        unnamed: ``defer()`` chose the name (``"value"``, ``"value_1"``, ...).
    """

    __slots__ = ("_done", "_dropped", "_event", "_host", "_wait", "name", "step", "unnamed")

    def __init__(
        self, step: int, name: str, host: Any, wait: Callable[[Deferred], None], *, unnamed: bool = False
    ) -> None:
        self.step, self.name, self.unnamed = step, name, unnamed
        self._host, self._wait = host, wait
        self._event: Event | None = None  # the step's event, once recorded
        self._done = False  # the step was seen complete
        self._dropped = False  # the step ended without an event: the value never arrives

    def _recorded(self, event: Event | None) -> None:
        self._event = event
        self._done = event is None  # a synchronous step is complete as it is recorded

    def ready(self) -> bool:
        """True once the step is complete (never for a dropped value). Queries; never blocks."""
        if self._done:
            return True
        event = self._event
        return event is not None and event.query()

    def get(self) -> Any:
        """The value on the host, waiting for its step if needed (a host-device sync on that step).

        Raises:
            RuntimeError: the step ended without an event (its body raised, or
                its event could not be recorded), so the value never arrives;
                or the step has not ended yet.
        """
        if self._dropped:
            raise RuntimeError(
                f"the value {self.name!r} of step {self.step} will never arrive: its step ended without an "
                "event (its body raised, or its event could not be recorded)"
            )
        if not self.ready():
            self._wait(self)
        return _map(self._host, _host_leaf)

    def item(self) -> float:
        """The value as a Python number (one-element tensors and arrays)."""
        value = self.get()
        return float(value.item()) if hasattr(value, "item") else float(value)

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        state = "ready" if self.ready() else "pending"
        return f"Deferred(step={self.step}, name={self.name!r}, {state})"


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

