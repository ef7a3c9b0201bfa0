"""The device side of deferred CUDA and XPU tensors: pinned ring buffers, copies, and current-stream
keys."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["RINGED", "TorchSnapshots"]

# the device types whose deferred tensors go into the pinned ring: torch gives both the same C
# functions (current stream as a key, current device) and the same Stream and Event classes
RINGED = ("cuda", "xpu")


class TorchSnapshots:
    """Pinned host buffers and non-blocking copies into them, for ``Throttle.defer`` of CUDA or XPU
    tensors (``kind``).

    A copy is enqueued on the current stream; the stream is known by its key,
    the ``(stream_id, device_index, device_type)`` tuple torch keeps in C++,
    so no Python ``Stream`` is made per tensor. :meth:`stream` makes one only
    for a side stream the step's event must join, once per stream.
    :class:`~asyncthrottle.parts.prefetch.PinnedRing` holds the buffers.
    """

    def __init__(self, kind: str) -> None:
        import torch

        if kind not in RINGED:
            raise ValueError(f"TorchSnapshots(kind={kind!r}): the ring holds {RINGED} tensors")
        self.kind = kind
        self._torch = torch
        self._module = getattr(torch, kind)
        # stream_key(index): the key of device index's current stream (a tuple of ints: no Python
        # Stream); torch's own C function (torch.cuda/xpu.current_stream's), so asking it makes no
        # Python call either
        self.stream_key: Callable[[int], Any] = getattr(torch._C, f"_{kind}_getCurrentStream")
        # copy(host, tensor): enqueue the copy of device tensor into pinned host on the current
        # stream; never blocks (torch's copy_ itself, no Python frame)
        self.copy: Callable[[Any, Any], Any] = functools.partial(torch.Tensor.copy_,
                                                                 non_blocking=True)
        self._streams: dict[Any, Any] = {}
        # events given back by release(), recorded again by marker()
        self._markers: list[Any] = []
        # current_device(): the current device's index (torch.cuda/xpu.current_device's own call)
        self.current_device: Callable[[], int] = getattr(torch._C, f"_{kind}_getDevice")

    def pin(self, nbytes: int) -> Any:
        """A pinned host buffer of ``nbytes`` bytes (a 1-d uint8 tensor)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)

    def event(self) -> Any:
        """No event per slot: the step's own event covers the copy, and the slot is reused after it
        retires."""
        return None

    def bare_event(self, event: Any) -> bool:
        """Whether ``event``, which cannot join another stream, records on the current device's
        current stream: a bare ``torch.cuda.Event`` (``torch.xpu.Event``; ``record()`` with no
        stream) does."""
        return isinstance(event, self._module.Event)

    def stream(self, key: Any) -> Any:
        """The ``torch.cuda.Stream`` (``torch.xpu.Stream``) of ``key``, made once per stream."""
        stream = self._streams.get(key)
        if stream is None:
            stream_id, device_index, device_type = key
            stream = self._module.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type)
            self._streams[key] = stream
        return stream

    def marker(self, key: Any) -> Any:
        """An event recorded now on the stream of ``key``, after the copies enqueued there so far
        (for a step event that cannot join that stream); reused once :meth:`release` gives it
        back. Never blocks."""
        free = self._markers
        event = free.pop() if free else self._module.Event()
        event.record(self.stream(key))
        return event

    def release(self, markers: list[Any]) -> None:
        """``markers`` are complete and nothing reads them any more: record them again."""
        self._markers.extend(markers)
