"""Snapshots of deferred values, per framework: JAX arrays held (or copied) with their host copy
started, torch tensors copied (CUDA and XPU ones into the pinned ring), numpy arrays copied; and
the device side of the ring's copies (pinned buffers, copies, current-stream keys)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ringcopies import RingCopies

__all__ = [
    "JAX_ARRAYS", "RINGED", "Snapshot", "TorchSnapshots", "host_leaf", "tensor_snapshot",
    "unring_leaf",
]

# the device types whose deferred tensors go into the pinned ring: torch gives both the same C
# functions (current stream as a key, current device) and the same Stream and Event classes
RINGED = ("cuda", "xpu")
# the types of JAX arrays seen (jaxlib's ArrayImpl), at most _JAX_KEPT, each with whether JAX runs
# off the CPU: a leaf of a type seen before is taken (and read back) without a call
JAX_ARRAYS: dict[type, bool] = {}
_JAX_KEPT = 8
# [whether JAX's default backend is not the CPU], once asked
_OFF_CPU: list[bool] = []


class Snapshot:
    """Takes the snapshot of one value's leaves, as ``Throttle.defer`` does (the leaf function of
    :func:`~asyncthrottle._tree.map_leaves`).

    A JAX array is held as it is (it is immutable; only a donation can take it),
    or copied on the device with ``copy=True``; off the CPU its host copy is
    started. A CUDA or XPU tensor is copied non-blocking into a slot of the
    pinned ring (:class:`~asyncthrottle.backends.ringcopies.RingCopies`), on the
    current stream. A CPU tensor or a numpy array is copied (the caller may
    update it in place); anything else is kept as it is.

    Args:
        synchronous: the throttle runs synchronously (no event orders the
            copies), so a copy from a device blocks until it is done.
        copy: copy JAX arrays on the device (they survive a later donation).
        ring: the ring copies of CUDA and XPU tensors (None: torch pins them).
    """

    __slots__ = ("copy", "held", "ring", "ringed", "synchronous")

    def __init__(self, synchronous: bool, copy: bool = False,
                 ring: RingCopies | None = None) -> None:
        self.synchronous, self.copy, self.ring = synchronous, copy, ring
        # JAX arrays held as they are: a donation can delete them
        self.held: list[Any] = []
        # a leaf is a view into the pinned ring, copied out when its step retires
        self.ringed = False

    def __call__(self, value: Any) -> Any:
        off_cpu = JAX_ARRAYS.get(type(value))
        if off_cpu is not None and not self.copy:
            # the usual leaf of a dict of metrics, a JAX array of a type seen before: _jax without
            # its calls
            self.held.append(value)
            if off_cpu:
                value.copy_to_host_async()
            return value
        # a tensor exists only if torch was imported
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            host, ringed = tensor_snapshot(value, self.synchronous, self.ring)
            self.ringed = self.ringed or ringed
            return host
        # a JAX array
        if hasattr(value, "copy_to_host_async"):
            return self._jax(value)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            # a snapshot: the caller may update the array in place
            return value.copy()
        return value

    def _jax(self, array: Any) -> Any:
        if len(JAX_ARRAYS) < _JAX_KEPT and type(array) not in JAX_ARRAYS:
            JAX_ARRAYS[type(array)] = _jax_off_cpu()
        if self.copy and hasattr(array, "copy"):
            # dispatched, never blocks; nobody else holds it, so nobody donates it
            array = array.copy()
        else:
            self.held.append(array)
        if _jax_off_cpu():
            # starts the device-to-host copy; on the CPU it would buy nothing
            array.copy_to_host_async()
        return array


def tensor_snapshot(tensor: Any, synchronous: bool, ring: RingCopies | None) -> tuple[Any, bool]:
    """The snapshot of one torch tensor, and whether it is a view into the pinned ring (see
    :class:`Snapshot`)."""
    if tensor.requires_grad:
        # (only then: detach() is a torch call, ~0.4 us)
        tensor = tensor.detach()
    # (is_cpu and is_cuda make no torch.device: 0.08 against 0.5 us)
    if tensor.is_cpu:
        # a snapshot: the caller may update the tensor in place
        return tensor.clone(), False
    if synchronous:
        return tensor.to("cpu"), False  # host-device sync: no order for a non-blocking copy here
    if ring is not None:
        # CUDA and XPU tensors: into the pinned ring (is_xpu read only off CUDA)
        kind = "cuda" if tensor.is_cuda else "xpu" if tensor.is_xpu else None
        if kind is not None:
            host = ring.copy(tensor, kind)
            if host is not None:
                return host, True
    # Non-blocking device-to-host copy (torch pins it, except for MPS, whose memory the host
    # shares), enqueued before the step's event.
    return tensor.to("cpu", non_blocking=True), False


def _jax_off_cpu() -> bool:
    """Whether JAX runs off the CPU here (a GPU or TPU is its default backend); asked once per
    process."""
    if not _OFF_CPU:
        _OFF_CPU.append(sys.modules["jax"].default_backend() != "cpu")
    return _OFF_CPU[0]


def host_leaf(value: Any) -> Any:
    """A leaf of a completed step's snapshot, on the host: JAX arrays become numpy arrays (neither
    way waits)."""
    off_cpu = JAX_ARRAYS.get(type(value))
    if off_cpu is None:
        if not hasattr(value, "copy_to_host_async"):
            return value
        off_cpu = _jax_off_cpu()
    numpy = sys.modules["numpy"]
    # On the CPU, np.asarray would be a view that silently keeps the user's later donation of the
    # array from happening: take a copy.
    return numpy.asarray(value) if off_cpu else numpy.array(value)


def unring_leaf(value: Any) -> Any:
    """A leaf of a snapshot with ring views: tensors are copied out of the ring (its slot is
    reused)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.clone()
    return host_leaf(value)


class TorchSnapshots:
    """Pinned host buffers and non-blocking copies into them, for ``Throttle.defer`` of CUDA or XPU
    tensors (``kind``).

    A copy is enqueued on the current stream; the stream is known by its key,
    the ``(stream_id, device_index, device_type)`` tuple torch keeps in C++,
    so no Python ``Stream`` is made per tensor. :meth:`stream` makes one only
    for a side stream the step's event must join, once per stream.
    :class:`~asyncthrottle.backends.copies.PinnedRing` holds the buffers.
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
