"""Deferred values: snapshots of a step's values on their way to the host, read once the step completes."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .events import Event

__all__ = ["Deferred", "Snapshot", "snapshot"]


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
