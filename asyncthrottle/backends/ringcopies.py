"""Deferred CUDA and XPU tensors copied into the pinned ring, and each step's event ordered after
those copies: it joins their streams, or, where it cannot, an event recorded after them is."""

from __future__ import annotations

import logging
import sys
from collections import deque
from typing import TYPE_CHECKING, Any

from . import snapshots
from .copies import PinnedRing

if TYPE_CHECKING:
    from ..core.events import Event
    from ..core.rule import Core

_log = logging.getLogger("asyncthrottle")
# steps of ring slots kept when depth=None bounds nothing
UNBOUNDED_STEPS = 4


class RingCopies:
    """The copies of one throttle's deferred CUDA (or XPU) tensors into its pinned ring.

    A copy is enqueued on the current stream, known by its key (no Python
    ``Stream`` per tensor); the step's event joins every other stream a copy
    of the step ran on (``wait_stream``), or an event recorded on that stream
    after the copies (a marker) is what the step's values wait for when read.
    A slot is written again only after the step that used it retired. The ring
    and its copy model (:class:`~asyncthrottle.backends.snapshots.TorchSnapshots`)
    are made at the first tensor.

    Args:
        core: the throttle's core (the current step, the depth).
    """

    def __init__(self, core: Core) -> None:
        self.core = core
        # the step whose copies ``keys`` and ``leaves`` count
        self.step = -1
        # keys of the streams that step's copies were enqueued on
        self.keys: list[Any] = []
        # ring copies in that step, and the most one step made
        self.leaves, self._per_step = 0, 1
        self.ring: PinnedRing | None = None
        # its TorchSnapshots (pinned buffers, stream keys)
        self.model: Any = None
        # a step's copies were on a stream its event cannot join (said once)
        self._unordered = False
        # (step, markers recorded after such copies), in step order, until the step retires
        self.copied: deque[tuple[int, list[Any]]] = deque()

    def copy(self, tensor: Any, kind: str) -> Any:
        """Enqueue ``tensor``'s copy into a ring slot on the current stream; None: torch pins it (no
        free slot, or a layout a flat slot cannot hold). ``kind``: its device type, ``"cuda"`` or
        ``"xpu"``."""
        ring, model = self.ring, self.model
        if ring is None:
            self.model = model = snapshots.TorchSnapshots(kind)
            self.ring = ring = PinnedRing(model, self._limit)
        elif kind != model.kind:
            raise ValueError(
                f"defer() got a tensor on {kind}, but this throttle's deferred tensors are on "
                f"{model.kind}: the step's event cannot be ordered after a copy on another kind of "
                f"device; defer its .cpu() copy, or use one throttle per device type")
        steps = self.core.steps
        if steps != self.step:
            # a new step: the last one's event covered its copies (a dropped step's number is the
            # next step's, so its copies stay counted and are covered by that step's event)
            self.step, self.keys, self.leaves = steps, [], 0
        # (get_device() makes no torch.device: a CUDA tensor's index)
        key = model.stream_key(tensor.get_device())
        keys = self.keys
        if key not in keys:
            keys.append(key)
        if tensor.layout is not sys.modules["torch"].strided or tensor.is_nested:
            # sparse and nested tensors have no flat bytes to view (nbytes raises for sparse ones):
            # torch's own copy, on the same stream
            return None
        self.leaves += 1
        if self.leaves > self._per_step:
            self._per_step = self.leaves
        nbytes = tensor.nbytes
        slot = ring.take(steps, nbytes)
        if slot.buffer is None:
            return None
        # a step defers the same tensors as the step before: the slot keeps its views (three
        # torch calls, 6.6 us on the host, made once per slot and kind of tensor)
        form = (tensor.dtype, tensor.shape)
        views = slot.views
        host = views.get(form)
        if host is None:
            host = slot.buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
            if len(views) < 8:
                views[form] = host
        model.copy(host, tensor)
        return host

    def close(self) -> None:
        """Let go of the ring and its copy model (the throttle is closed: no copy is made after;
        a value still read from a slot holds its buffer itself)."""
        if self.ring is not None:
            self.ring.clear()
        self.ring = self.model = None
        self.copied.clear()
        self.keys = []

    def _limit(self) -> int:
        depth = self.core.depth
        return ((UNBOUNDED_STEPS if depth is None else depth) + 2) * self._per_step

    def order(self, step: int, event: Event) -> list[Any] | None:
        """Order ``step``'s event (about to be recorded) after the copies of the step; returns the
        markers its values must wait for when read (None: the event covers every copy)."""
        if step != self.step:
            # no copy in this step
            return None
        join = getattr(event, "wait_stream", None)
        if join is None:
            return self._mark(step, event)
        # The key of the stream the event records on: a copy enqueued there is ordered before it
        # already. That is the current stream of the event's device, not of the tensor's: a tensor
        # on another GPU is copied on that GPU's stream, which the event must join.
        model = self.model
        index = (getattr(event, "device_index", None)
                 if getattr(event, "records_on_current", False) else None)
        here = model.stream_key(index()) if index is not None else None
        for key in self.keys:
            if key != here:
                join(model.stream(key))
        return None

    def _mark(self, step: int, event: Event) -> list[Any] | None:
        """The markers of the copies that ``event``, which cannot join a stream (no
        ``wait_stream``: JAX's events, most custom ``events=``), does not cover: an event is
        recorded on each such stream, after them (never blocks here). A bare
        ``torch.cuda.Event`` covers the copies on the stream it records on, the current device's
        current stream."""
        model = self.model
        here = (model.stream_key(model.current_device()) if model.bare_event(event)
                else None)
        markers = []
        for key in self.keys:
            if key == here:
                continue
            if not self._unordered:
                self._unordered = True
                _log.warning(
                    "asyncthrottle: a deferred tensor was copied on a stream the throttle's events "
                    "cannot be ordered after (%r has no wait_stream(stream)), so an event is "
                    "recorded there each step and its values wait for it when read; defer on the "
                    "current stream, use the tensor's device as the throttle's, or give the "
                    "events a wait_stream method", type(event))
            # recorded after the copies enqueued there so far; never blocks
            markers.append(model.marker(key))
        if not markers:
            return None
        # (also for a step with no value: a failed step's copies, covered here, write into ring
        # slots taken again once this step retires)
        self.copied.append((step, markers))
        return markers

    def release(self, step: int) -> None:
        """Wait for the markers of steps up to ``step`` (complete) before their values are read;
        the markers go back to the model."""
        copied, model = self.copied, self.model
        while copied and copied[0][0] <= step:
            markers = copied.popleft()[1]
            for marker in markers:
                # host-device sync: see _mark; the step itself is complete
                marker.synchronize()
            model.release(markers)
            # (the step's values share the list: they have nothing left to wait for)
            markers.clear()
