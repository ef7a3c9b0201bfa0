"""The backends: a device resolved once into one :class:`Backend` (its events, memory probe,
copies).

Nothing outside this package branches on a device's kind: the throttle and its
parts ask the backend object instead.
"""

from __future__ import annotations

from typing import Any

from ..core.events import EventFactory
from .memory import MemoryProbe
from .pool import EventPool

__all__ = ["Backend", "names_the_host", "resolve_backend"]


class Backend:
    """One device, resolved once: what the throttle and its parts need to know of it.

    Attributes:
        kind: ``"cpu"``, ``"cuda"``, ``"mps"``, ``"xpu"``, another ``torch.Event``
            device type, ``"jax"``, or ``"events"`` (a custom ``events=`` factory).
        device: the ``device=`` option as given (None: auto-detected).
        events: the factory of step events; None on a synchronous backend (the CPU).
        timed: a factory of events with ``elapsed_time`` (None: no device timing); ``new_event``
            itself where every event can be timed (JAX, a custom ``events=``).
        trusted: ``timed``'s events are known to have ``elapsed_time`` (a built-in backend).
        streams: the ``streams=`` option as given: the streams the events are recorded on (None: the
            current one).
        computes_on_host: the device's work runs on the host's own cores (JAX's CPU backend): a
            wait that spins or wakes often takes CPU from the steps (``wait="auto"`` blocks).
    """

    def __init__(
        self,
        kind: str,
        device: Any,
        events: EventFactory | None,
        timed: EventFactory | None,
        *,
        trusted: bool,
        streams: Any = None,
        computes_on_host: bool = False,
    ) -> None:
        self.kind, self.device, self.events = kind, device, events
        self.timed, self.trusted = timed, trusted
        self.streams, self.computes_on_host = streams, computes_on_host

    @property
    def synchronous(self) -> bool:
        return self.events is None

    def release(self) -> None:
        """Let go of the events the built-in backends keep for reuse (the throttle is closed); a
        custom ``events=`` factory is the user's, and left alone."""
        for factory in (self.events, self.timed):
            if isinstance(factory, EventPool):
                factory.clear()

    def memory_probe(self) -> MemoryProbe:
        """The default probe of ``max_memory=``.

        Raises:
            ValueError: the backend has none (the CPU, MPS, XPU, custom ``events=``).
        """
        from . import memory

        if self.kind == "cuda":
            return memory.cuda_probe(self.device)
        if self.kind == "jax":
            return memory.jax_probe(self.device)
        raise ValueError(
            f"max_memory needs a probe on this backend ({self.kind}): there is no default memory "
            "probe for it; pass max_memory=asyncthrottle.MemoryBudget(<bytes>, probe=<a "
            "zero-argument callable returning the bytes held>), e.g. probe=asyncthrottle.memory."
            "rss_bytes"
        )

    def mover(self, to: Any) -> tuple[Any, Any, bool]:
        """Where ``to=`` sends batches: ``(target torch.device, copy model or None, non_blocking)``.

        A copy model (CUDA, asynchronous) stages copies through pinned buffers on a
        copy stream, ordered before every stream the events are recorded on
        (``streams=``); None means a plain ``.to(target)``, ``non_blocking`` where the
        target orders the copy on its own queue (off the CPU).

        Raises:
            TypeError, ValueError: ``to`` is not a device, or not this throttle's.
            RuntimeError: ``to``'s device is not available here.
        """
        from . import torch as torch_backend

        target, model = torch_backend.mover(
            to, self.kind, self.device, synchronous=self.synchronous, streams=self.streams
        )
        return target, model, target.type != "cpu"

    def sync_debug(self) -> Any:
        """``torch.cuda`` when CUDA's sync debug mode can watch this backend's steps, else None.

        A custom ``events=`` backend gets it when CUDA is available (the events may well be CUDA's).
        """
        if self.kind not in ("cuda", "events"):
            return None
        from . import torch as torch_backend

        return torch_backend.cuda_module()

    @property
    def host_advice(self) -> str:
        """The verdict's advice for a loop body that keeps the host busy, in this device's terms."""
        busy = "the host spends its time in the loop body (Python, "
        if self.kind == "jax":
            return (busy + "dispatching, or a sync such as float() of an array or "
                    "block_until_ready()): try jax.jit over more of the step, bigger batches, or "
                    "lax.scan over several steps, and defer() values")
        graphs = " or CUDA graphs" if self.kind == "cuda" else ""
        named = " that detect_sync='warn' would name" if self.kind in ("cuda", "events") else ""
        return (busy + f"kernel launches, or a sync such as .item(){named}): try bigger batches, "
                f"torch.compile{graphs}, and defer() values")

    def describe(self) -> str:
        return "a custom events= backend" if self.kind == "events" else self.kind


def resolve_backend(
    device: Any, events: EventFactory | None, streams: Any, *, blocking: bool, timing: bool
) -> Backend:
    """Resolve ``device=``/``events=``/``streams=`` once into a :class:`Backend`.

    Args:
        device: None (auto-detect), a device string, a ``torch.device`` or a JAX device.
        events: a custom zero-argument event factory (then ``device`` and ``streams`` must be None).
        streams: record on these streams (one event each) instead of the current stream.
        blocking: events whose ``synchronize()`` sleeps in the driver (``wait="block"``).
        timing: also make a factory of timing events (device timing is on).
    """
    if events is not None:
        if device is not None or streams is not None:
            raise ValueError("pass events= or device=/streams=, not both: events= replaces the "
                             "device backend")
        if not callable(events):
            raise TypeError("events must be a zero-argument callable returning an event, got "
                            f"{events!r}")
        return Backend("events", None, events, events if timing else None, trusted=False)
    from . import torch as torch_backend

    kind = torch_backend.device_kind(device)
    new_event = torch_backend.resolve_events(device, streams=streams, blocking=blocking)
    timed = None
    if timing and new_event is not None:
        # every JAX event can be timed: its steps' own events are the timing ones
        timed = new_event if kind == "jax" else torch_backend.resolve_events(
            device, streams=streams, blocking=blocking, timing=True
        )
    computes_on_host = False
    if kind == "jax":
        from .jax import computes_on_host as on_host

        computes_on_host = on_host(device)
    return Backend(kind, device, new_event, timed, trusted=True, streams=streams,
                   computes_on_host=computes_on_host)


def names_the_host(device: Any) -> bool:
    """Whether a ``device=`` argument names the CPU (``"cpu"``, ``torch.device("cpu")``): the
    audit's question of a tensor built with it, answered here with every other kind's."""
    return str(device) == "cpu"
