"""``to=device``: each batch copied to the device one step ahead, staged through a ring of pinned
buffers."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import Option
from .._tree import map_leaves
from ..backends.copies import CopyModel, PinnedRing, Slot
from ._build import Part

if TYPE_CHECKING:
    from ..backends import Backend
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
    """``to=``: the movers of the throttle's wrapped loops, one per target device.

    ``wrap(iterable, to=device)`` asks :meth:`mover` for its device's mover
    (made at the first such wrap and kept, so a loop that wraps again every
    epoch reuses its ring); the view calls it with each batch as it is
    fetched. It subscribes to nothing, so it costs a loop without ``to=``
    nothing, and supplies ``stats.pinned_bytes``: what the rings hold.
    ``Throttle(to=)`` (before 0.4; it goes in 0.5) is the default of every
    ``wrap()`` of that throttle.

    Args:
        core: the throttle's core (step numbers, retirements, depth).
        backend: the resolved device (``Backend.mover``: where a ``to=`` goes, and how).
    """

    PLACE = 70
    OPTIONS = (
        Option("to", "Any", None, "every `wrap()`'s default `to=`", "",
               lambda name, value: check_to(value), wrong_type=(3,),
               deprecated="`wrap(loader, to=...)`",
               help=('deprecated (it goes in 0.5): ``wrap(iterable, to=...)``; here, the default '
                     'of every :meth:`wrap`.')),
    )
    STATS = PrefetchStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        to = options["to"]
        if to is not None:
            warn_at_user(f"Throttle(to={to!r}) is deprecated (it goes in 0.5): to= is the "
                         f"wrapper's, pass thr.wrap(loader, to={to!r}) or "
                         f"asyncthrottle.throttle(loader, to={to!r})", DeprecationWarning)

    @classmethod
    def build(cls, at: Build) -> Prefetch:
        """The movers, with ``Throttle(to=)``'s made now (a device error raises here)."""
        movers = cls(at.core, at.backend)
        movers.default = movers.mover(at.options["to"])
        return movers

    def __init__(self, core: Core, backend: Backend) -> None:
        self._core, self._backend = core, backend
        # the target torch.device -> its mover
        self.movers: dict[Any, RingCopy | PlainTo] = {}
        # Throttle(to=)'s mover: a wrap without to= uses it
        self.default: RingCopy | PlainTo | None = None

    def mover(self, to: Any) -> RingCopy | PlainTo | None:
        """The mover of ``to`` (None: the default); a :class:`RingCopy` where the backend has a
        copy model (CUDA), else a :class:`PlainTo`.

        Raises:
            TypeError, ValueError: ``to`` is not a device, or not this throttle's.
            RuntimeError: ``to``'s device is not available here.
        """
        if to is None:
            return self.default
        target, model, non_blocking = self._backend.mover(check_to(to))
        made = self.movers.get(target)
        if made is None:
            made = PlainTo(target, non_blocking) if model is None else RingCopy(self._core, model)
            self.movers[target] = made
        return made

    def close(self) -> None:
        """Let go of the rings' pinned buffers (a view kept by the user keeps its mover, not its
        ring's memory)."""
        for made in self.movers.values():
            if isinstance(made, RingCopy):
                made.ring.clear()
        self.movers.clear()
        self.default = None

    def fields(self) -> dict[str, Any]:
        rings = [m.ring.nbytes for m in self.movers.values() if isinstance(m, RingCopy)]
        return {"pinned_bytes": sum(rings)}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if not stats.pinned_bytes:
            return []
        return [f"  to=: {stats.pinned_bytes / 2**20:,.1f} MiB pinned by the staging ring"]


def check_to(to: Any) -> Any:
    """``to``: None, a str such as ``"cuda"`` or a ``torch.device`` (a wrong type: ``TypeError``;
    the device itself is the backend's to check)."""
    if to is not None and not isinstance(to, str) and type(to).__name__ != "device":
        raise TypeError(
            f"to must be None, a str such as 'cuda' or 'cuda:1', or a torch.device, got {to!r} "
            f"({type(to).__name__}); pass the throttle's device, e.g. to='cuda'"
        )
    return to


class RingCopy:
    """Copies each fetched batch to the device on a copy stream; the step that uses it waits on its
    event only.

    The wrapper calls it with batch ``n + 1`` right after recording step
    ``n``, so the copy overlaps step ``n``. Host tensors are staged through
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


class PlainTo:
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
