"""The device side of deferred CUDA tensors: pinned ring buffers, copies, and current-stream
keys."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["CudaSnapshots"]


class CudaSnapshots:
    """Pinned host buffers and non-blocking copies into them, for ``Throttle.defer`` of CUDA
    tensors.

    A copy is enqueued on the current stream; the stream is known by its key,
    the ``(stream_id, device_index, device_type)`` tuple torch keeps in C++,
    so no Python ``Stream`` is made per tensor. :meth:`stream` makes one only
    for a side stream the step's event must join, once per stream.
    :class:`~asyncthrottle.parts.prefetch.PinnedRing` holds the buffers.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        # stream_key(index): the key of device index's current stream (a tuple of ints: no Python
        # Stream); torch's own C function, so asking it makes no Python call either
        self.stream_key: Callable[[int], Any] = torch._C._cuda_getCurrentStream
        # copy(host, tensor): enqueue the copy of device tensor into pinned host on the current
        # stream; never blocks (torch's copy_ itself, no Python frame)
        self.copy: Callable[[Any, Any], Any] = functools.partial(torch.Tensor.copy_,
                                                                 non_blocking=True)
        self._streams: dict[Any, Any] = {}
        # current_device(): the current CUDA device's index (torch.cuda.current_device's own call)
        self.current_device: Callable[[], int] = torch._C._cuda_getDevice

    def pin(self, nbytes: int) -> Any:
        """A pinned host buffer of ``nbytes`` bytes (a 1-d uint8 tensor)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)

    def event(self) -> Any:
        """No event per slot: the step's own event covers the copy, and the slot is reused after it
        retires."""
        return None

    def bare_event(self, event: Any) -> bool:
        """Whether ``event``, which cannot join another stream, records on the current device's
        current stream: a bare ``torch.cuda.Event`` (``record()`` with no stream) does."""
        return isinstance(event, self._torch.cuda.Event)

    def stream(self, key: Any) -> Any:
        """The ``torch.cuda.Stream`` of ``key``, made once per stream."""
        stream = self._streams.get(key)
        if stream is None:
            stream_id, device_index, device_type = key
            stream = self._torch.cuda.Stream(  # type: ignore[no-untyped-call]
                stream_id=stream_id, device_index=device_index, device_type=device_type)
            self._streams[key] = stream
        return stream
