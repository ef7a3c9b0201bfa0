"""Pinned staging: the ring of pinned buffers (``to=``'s batches, deferred CUDA/XPU tensors) and
``to=``'s copy model, one copy stream and its events (CUDA, or a test's fake)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Pins(Protocol):
    """What a :class:`PinnedRing` makes its slots with."""

    def pin(self, nbytes: int) -> Any:
        """A pinned host buffer of ``nbytes`` bytes (a 1-d uint8 tensor)."""

    def event(self) -> Any:
        """A new copy event (one per ring slot: re-recorded only when its slot is reused), or
        None."""


class Slot:
    """One pinned staging buffer, its copy event, the step that used it last, and the typed views
    of its buffer made so far (by deferred values: ``(dtype, shape)`` to a view)."""

    __slots__ = ("buffer", "event", "nbytes", "step", "views")

    def __init__(self, buffer: Any, nbytes: int, event: Any, step: int) -> None:
        self.buffer, self.nbytes, self.event, self.step = buffer, nbytes, event, step
        self.views: dict[Any, Any] = {}


class PinnedRing:
    """Pinned staging slots; a slot is taken again only after the step that used it last retired.

    Args:
        model: makes the buffers and events.
        limit: returns the most slots to keep now (the throttle's depth + 2).
    """

    def __init__(self, model: Pins, limit: Callable[[], int]) -> None:
        self._model, self._limit = model, limit
        self.free: list[Slot] = []
        # in step order
        self.busy: deque[Slot] = deque()
        # bytes per slot: the largest batch seen
        self.size = 0
        # pinned bytes the ring holds
        self.nbytes = 0
        # batches staged by torch's own pinned pool: every slot was busy
        self.overflows = 0

    def take(self, step: int, need: int) -> Slot:
        """A slot of at least ``need`` bytes for ``step``; beyond the limit, a transient one (no
        buffer)."""
        self.size = max(self.size, need)
        if self.free:
            slot = self.free.pop()
        elif len(self.busy) < self._limit():
            slot = Slot(None, 0, self._model.event(), step)
        else:
            self.overflows += 1
            # not kept: torch pins its tensors
            return Slot(None, 0, self._model.event(), step)
        # grown only when a batch is larger than every batch before it
        if slot.nbytes < need:
            self.nbytes += self.size - slot.nbytes
            slot.buffer, slot.nbytes = self._model.pin(self.size), self.size
            # views of the old buffer: let it go
            slot.views = {}
        slot.step = step
        self.busy.append(slot)
        return slot

    def clear(self) -> None:
        """Let go of every slot and its buffer (the throttle is closed; a value still read from a
        slot holds its buffer itself)."""
        self.free.clear()
        self.busy.clear()
        self.size = self.nbytes = 0

    def retire(self, step: int) -> None:
        """``step`` and every step before it completed: their slots may be written again."""
        busy = self.busy
        while busy and busy[0].step <= step:
            self.free.append(busy.popleft())


class CopyModel(Pins, Protocol):
    """The device side of a prefetch: pinned buffers, a copy stream, its events (CUDA, or a test's
    fake)."""

    def is_pinned(self, tensor: Any) -> bool:
        """Whether a host tensor is in pinned memory already (then it is copied directly)."""

    def pin_copy(self, tensor: Any) -> Any:
        """A pinned copy of ``tensor`` from torch's caching host allocator (when every slot is
        busy)."""

    def copying(self) -> AbstractContextManager[Any]:
        """Make the copy stream current for the copies of one batch."""

    def copy(self, host: Any) -> Any:
        """Enqueue the non-blocking copy of pinned ``host`` on the copy stream; return the device
        tensor."""

    def join(self, event: Any) -> None:
        """Record ``event`` after the batch's copies; the compute streams wait on it (and nothing
        else)."""


class CudaCopy:
    """The copy model on CUDA: one copy stream (made at the first batch), pinned buffers, events.

    The compute streams are the throttle's ``streams=``, or else the stream
    current when the batch is fetched (where the next step runs). Each of them
    waits on the batch's copy event, and device tensors are allocated on the
    copy stream and ``record_stream``-ed to each: the caching allocator reuses
    a block only after the work every compute stream queued before it was
    freed is done.

    Args:
        device: the CUDA ``torch.device`` the batches go to.
        streams: the streams the throttle records on (``streams=``), or None: the current stream.
    """

    def __init__(self, device: Any, streams: Sequence[Any] | None = None) -> None:
        import torch

        self._torch, self.device = torch, device
        self._stream: Any = None
        self._streams = tuple(streams) if streams else None
        self._compute: tuple[Any, ...] = ()

    def pin(self, nbytes: int) -> Any:
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)

    def event(self) -> Any:
        return self._torch.cuda.Event()  # type: ignore[no-untyped-call]  # no timing: cheaper to record

    def is_pinned(self, tensor: Any) -> bool:
        return bool(tensor.is_pinned())

    def pin_copy(self, tensor: Any) -> Any:
        # the allocator reuses the block once the copy's event completes
        return tensor.pin_memory()

    def copying(self) -> AbstractContextManager[Any]:
        cuda = self._torch.cuda
        if self._stream is None:
            # once: making a stream costs microseconds
            self._stream = cuda.Stream(self.device)
        # where the next step runs
        self._compute = self._streams or (cuda.current_stream(self.device),)
        return cuda.stream(self._stream)  # type: ignore[no-any-return]

    def copy(self, host: Any) -> Any:
        # pinned source: never blocks the host
        device = host.to(self.device, non_blocking=True)
        for stream in self._compute:
            device.record_stream(stream)
        return device

    def join(self, event: Any) -> None:
        event.record(self._stream)
        for stream in self._compute:
            # enqueues a wait on the device; never blocks the host
            stream.wait_event(event)
