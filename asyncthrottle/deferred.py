"""Deferred values: a step's tensors copied to the host without a sync, read once the step completes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Deferred", "start_copy"]


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _map(value: Any, leaf: Callable[[Any], Any]) -> Any:
    if isinstance(value, dict):
        return {key: _map(item, leaf) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_map(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, leaf) for item in value)
    return leaf(value)


def _copy_leaf(value: Any) -> Any:
    if _is_torch_tensor(value):
        tensor = value.detach()
        if tensor.device.type == "cpu":
            return tensor.clone()  # a snapshot: the caller may update the tensor in place
        # Non-blocking device-to-host copy into pinned memory, enqueued before the step's event.
        return tensor.to("cpu", non_blocking=True)
    if hasattr(value, "copy_to_host_async"):  # a JAX array: start the transfer, read it later
        value.copy_to_host_async()
        return value
    return value


def _host_leaf(value: Any) -> Any:
    if hasattr(value, "copy_to_host_async"):
        import numpy as np

        return np.asarray(value)  # the step is complete: this does not wait
    return value


def start_copy(value: Any) -> Any:
    """Start copying ``value`` (a tensor, a JAX array, or a nested dict/list/tuple of them) to the host."""
    return _map(value, _copy_leaf)


class Deferred:
    """A value from one step, readable once that step is complete.

    ``ready()`` never blocks. ``get()`` waits for this value's step only --
    never for a later step, never a device-wide sync -- and the wait counts as
    host wait in the throttle's stats.

    Attributes:
        step: the step the value belongs to.
        name: its name in ``Throttle.latest`` and ``on_complete`` callbacks.
    """

    __slots__ = ("_host", "_is_ready", "_wait", "name", "step")

    def __init__(self, step: int, name: str, host: Any, is_ready: Callable[[int], bool],
                 wait: Callable[[int], None]) -> None:
        self.step, self.name = step, name
        self._host, self._is_ready, self._wait = host, is_ready, wait

    def ready(self) -> bool:
        """True once the step is complete. Queries; never blocks."""
        return self._is_ready(self.step)

    def get(self) -> Any:
        """The value on the host, waiting for its step if needed (a host-device sync on that step)."""
        if not self._is_ready(self.step):
            self._wait(self.step)
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
