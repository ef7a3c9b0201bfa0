"""``to=device``: each batch copied to the device one step ahead, staged through a ring of pinned
buffers."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._tree import map_leaves
from ..backends.copies import CopyModel, PinnedRing, Slot
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

# bytes: each staged tensor starts at a multiple (any dtype may view it)
_ALIGN = 64
# slots the ring keeps when depth=None bounds nothing
UNBOUNDED_SLOTS = 4


@dataclasses.dataclass(frozen=True)
class PrefetchStats:
    """The field of :class:`~asyncthrottle.Stats` that ``to=`` supplies."""

    pinned_bytes: int = 0


class Prefetch(Part):
    """Copies each fetched batch to the device on a copy stream; the step that uses it waits on its
    event only.

    The wrapper calls it (its one way in: it subscribes to nothing) with
    batch ``n + 1`` right after recording step ``n``, so the copy overlaps
    step ``n``. Host tensors are staged through
    the ring (pinned ones are copied directly); the compute stream waits on
    the batch's copy event, not on the whole copy stream. A slot is written
    again only after the step that used it retired (asked of the core as a
    slot is taken): that step waited on the copy, so the copy out of the
    slot is done. Device tensors are allocated
    on the copy stream and ``record_stream``-ed to the compute stream (see
    :meth:`~asyncthrottle.copies.CudaCopy.copy`). Never blocks and never syncs.

    Args:
        core: the throttle's core (step numbers, retirements, depth).
        model: the copy model (:class:`CudaCopy`).
    """

    OPTIONS = ("to",)
    STATS = PrefetchStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        to = options["to"]
        if to is not None and not isinstance(to, str) and type(to).__name__ != "device":
            raise TypeError(
                f"to must be None, a str such as 'cuda' or 'cuda:1', or a torch.device, got {to!r} "
                f"({type(to).__name__}); pass the throttle's device, e.g. to='cuda'"
            )

    @classmethod
    def build(cls, at: Build) -> Prefetch | PlainTo | None:
        """A :class:`Prefetch` where the backend has a copy model (CUDA), else a
        :class:`PlainTo`."""
        if at.options["to"] is None:
            return None
        target, model, non_blocking = at.backend.mover(at.options["to"])
        if model is None:
            return PlainTo(target, non_blocking=non_blocking)
        return cls(at.core, model)

    def fields(self) -> dict[str, Any]:
        return {"pinned_bytes": self.ring.nbytes}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if not stats.pinned_bytes:
            return []
        return [f"  to=: {stats.pinned_bytes / 2**20:,.1f} MiB pinned by the staging ring"]

    def __init__(self, core: Core, model: CopyModel) -> None:
        self._core, self._model = core, model
        self.ring = PinnedRing(model, self._limit)

    def _limit(self) -> int:
        depth = self._core.depth
        return UNBOUNDED_SLOTS if depth is None else depth + 2

    @property
    def pinned_bytes(self) -> int:
        return self.ring.nbytes

    def __call__(self, batch: Any) -> Any:
        torch = sys.modules["torch"]
        pinned = self._model.is_pinned
        # host tensors to stage through the slot, in leaf order
        staged: list[Any] = []
        hosts = 0

        def plan(leaf: Any) -> Any:
            nonlocal hosts
            # (is_cpu makes no torch.device)
            if isinstance(leaf, torch.Tensor) and leaf.is_cpu:
                hosts += 1
                if not pinned(leaf):
                    staged.append(leaf)
            return leaf

        map_leaves(batch, plan)
        if not hosts:
            # nothing on the host: nothing to copy, nothing to wait for
            return batch
        need = sum(_padded(t) for t in staged)
        core = self._core
        # the slots of the steps retired since are free again
        self.ring.retire(core.completed - 1)
        slot = self.ring.take(core.steps, need)
        with self._model.copying():
            moved = map_leaves(batch, _Stager(torch, self._model, slot, {id(t) for t in staged}))
            self._model.join(slot.event)
        return moved


class _Stager:
    """Moves one batch's host tensors: through the slot's buffer (or torch's pinned pool), then to
    the device."""

    def __init__(self, torch: Any, model: CopyModel, slot: Slot, staged: set[int]) -> None:
        self._torch, self._model, self._slot, self._staged = torch, model, slot, staged
        self._offset = 0

    def __call__(self, leaf: Any) -> Any:
        if not isinstance(leaf, self._torch.Tensor) or not leaf.is_cpu:
            return leaf
        host = leaf
        if id(leaf) in self._staged:
            buffer = self._slot.buffer
            # every slot busy: torch's caching host allocator pins it (safe, unbounded)
            if buffer is None:
                host = self._model.pin_copy(leaf)
            else:
                start, nbytes = self._offset, leaf.numel() * leaf.element_size()
                self._offset += _padded(leaf)
                host = buffer[start:start + nbytes].view(leaf.dtype).view(leaf.shape)
                # host memcpy into pinned memory; the device reads it after
                host.copy_(leaf)
        return self._model.copy(host)


def _padded(tensor: Any) -> int:
    nbytes = int(tensor.numel() * tensor.element_size())
    return -(-nbytes // _ALIGN) * _ALIGN


class PlainTo(Part):
    """``.to(device)`` on every tensor of a batch: ``to=`` where there is no copy model (the CPU,
    MPS, XPU)."""

    def __init__(self, device: Any, non_blocking: bool = False) -> None:
        self.device, self.non_blocking = device, non_blocking

    def __call__(self, batch: Any) -> Any:
        torch = sys.modules.get("torch")
        device, non_blocking = self.device, self.non_blocking

        def leaf(value: Any) -> Any:
            if torch is not None and isinstance(value, torch.Tensor):
                return value.to(device, non_blocking=non_blocking)
            return value

        return map_leaves(batch, leaf)

    @classmethod
    def build(cls, at: Build) -> PlainTo:
        raise NotImplementedError("PlainTo is built by Prefetch.build")
