"""Event backends for PyTorch devices: CUDA, MPS, XPU, ``torch.Event``, and the CPU."""

from __future__ import annotations

import functools
import gc
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..core.events import EventFactory, MultiEvent
from .pool import EventPool

_NAMED = ("cuda", "xpu", "mps")


def _torch() -> Any:
    # deferred: `import asyncthrottle` stays cheap
    first = "torch" not in sys.modules
    import torch

    if first:
        # The first import, here (a throttle built before the script imported torch): torch's
        # import leaves frames in reference cycles (``torch.fx.wrap`` keeps its own frame in a
        # local), and a frame holds its callers', the throttle's constructor among them, so the
        # throttle would outlive its last reference until the cyclic GC ran. One collection, once
        # (about 3% of the import's own time).
        gc.collect()
    return torch


def detect_device() -> str:
    """The device type training would use here: an available accelerator, else ``"cpu"``.

    ``torch.accelerator.current_accelerator()`` answers ``cuda`` on any CUDA
    build, GPU or not, so availability is checked as well.
    """
    try:
        torch = _torch()
    except ImportError:
        return "cpu"
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        if accelerator.is_available():
            return str(accelerator.current_accelerator().type)
        return "cpu"
    # torch < 2.6
    for name in _NAMED:
        module = getattr(torch, name, None)
        if module is not None and module.is_available():
            return name
    return "cpu"


def _is_available(torch: Any, kind: str) -> bool:
    module = getattr(torch, kind, None)
    if module is not None and hasattr(module, "is_available"):
        return bool(module.is_available())
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return False
    current = accelerator.current_accelerator()
    return bool(current is not None and current.type == kind and accelerator.is_available())


def parse_torch_device(device: Any, option: str = "device") -> Any:
    """The ``torch.device`` a user's ``device=`` or ``to=`` names (a str or a ``torch.device``);
    errors name ``option``."""
    torch = _torch()
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"{option} must be None, a str such as 'cuda' or 'cuda:1', or a torch.device, got "
            f"{type(device).__name__}"
        )
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(
            f"{option}={device!r} is not a device torch knows ({exc}); try 'cuda', 'mps', 'xpu' or "
            "'cpu'"
        ) from None


# devices whose host-to-device copies overlap the device's work only from pinned memory
_PINNED_COPIES = ("cuda", "xpu", "npu", "hpu")


def copies_need_pinned_memory(device: Any) -> bool:
    """Whether host-to-device copies to ``device`` (a ``torch.device``; None: the CPU) overlap the
    device's work only from pinned memory, copied ``non_blocking``: CUDA, XPU, NPU, HPU."""
    return getattr(device, "type", "cpu") in _PINNED_COPIES


def names_the_host(device: Any) -> bool:
    """Whether ``device``, as ``Tensor.to()`` takes it (a str, a ``torch.device``; a dtype or a
    tensor is no device), names the CPU: a copy there lands in the host's memory."""
    if isinstance(device, str):
        return device.split(":")[0] == "cpu"
    return isinstance(device, _torch().device) and device.type == "cpu"


class TorchEvent:
    """A torch event recorded on a stream chosen at record time; one object is re-recorded step
    after step.

    ``query`` and ``synchronize`` are the torch event's own methods (no Python
    call in between on the per-step path).

    Args:
        event: the torch event (``torch.Event``, ``torch.cuda.Event``, ...).
        stream: a fixed stream; or a zero-argument callable returning the
            stream to record on (None: the current one); or None: the current
            stream of the current device -- ``torch.Event.record()`` finds it
            in C++, without a Python ``Stream`` object.
        capturing: a callable that is True while a CUDA graph is being captured.
        current: returns the current stream, to join side streams to
            (:meth:`wait_stream`) when ``stream`` does not name one.
        device_index: returns the index of the device whose current stream it
            records on (CUDA, XPU), so a copy on another device's stream is known to
            need a join; None: not known (every copy stream is joined).
    """

    __slots__ = ("_after", "_capturing", "_current", "_event", "_stream", "device_index", "query",
                 "records_on_current", "synchronize")

    query: Callable[[], bool]
    synchronize: Callable[[], None]

    def __init__(
        self,
        event: Any,
        stream: Any = None,
        capturing: Callable[[], bool] | None = None,
        current: Callable[[], Any] | None = None,
        device_index: Callable[[], int] | None = None,
    ) -> None:
        self._event, self._stream = event, stream
        self._capturing, self._current = capturing, current
        self.device_index = device_index
        # it records on the current stream of its device, not on a fixed stream (an attribute, not
        # a property: read once a step)
        self.records_on_current = stream is None or callable(stream)
        self._after: list[Any] = []
        self.query = event.query
        # host-device sync when called: the caller chose to block
        self.synchronize = event.synchronize

    def wait_stream(self, stream: Any) -> None:
        """Order this event after the work enqueued on ``stream`` so far (joined when it is next
        recorded).

        Deferred values copied on a side stream use it, so the step's event covers their copies.
        """
        self._after.append(stream)

    def record(self) -> None:
        capturing = self._capturing
        if capturing is not None and capturing():
            # the step is dropped: the streams it was to join are the throttle's next step's
            self._after = []
            raise RuntimeError(
                "asyncthrottle cannot record an event while a CUDA graph is being captured on the "
                "current stream: call the throttle (its wrapper's next(), step(), mark(), drain()) "
                "outside the captured region, e.g. around graph.replay()"
            )
        stream = self._stream
        if stream is not None and callable(stream):
            stream = stream()
        if self._after:
            self._join(stream)
        if stream is None:
            self._event.record()
        else:
            self._event.record(stream)

    def _join(self, stream: Any) -> None:
        target = (
            stream if stream is not None else self._current() if self._current is not None else None
        )
        for other in self._after:
            if target is not None and other != target:
                # enqueues a wait on the device; never blocks the host
                target.wait_stream(other)
        self._after = []

    def elapsed_time(self, end: TorchEvent) -> float:
        return float(self._event.elapsed_time(end._event))


def _raw_factory(torch: Any, device: Any, *, blocking: bool, timing: bool) -> Callable[[], Any]:
    kind = device.type
    # its record() takes no stream: no Python Stream object per step either
    if kind == "mps":
        return functools.partial(torch.mps.event.Event, enable_timing=timing)
    if kind == "cuda" and (blocking or not hasattr(torch, "Event")):
        # torch.Event ignores blocking=; only torch.cuda.Event makes synchronize() sleep in the
        # driver.
        return functools.partial(torch.cuda.Event, enable_timing=timing, blocking=blocking)
    if kind == "xpu" and not hasattr(torch, "Event"):
        return functools.partial(torch.xpu.Event, enable_timing=timing)
    if not hasattr(torch, "Event"):
        raise RuntimeError(
            f"device={str(device)!r} needs torch.Event (torch >= 2.4); upgrade torch"
        )
    # timing off: cheaper records
    return functools.partial(torch.Event, device=device, enable_timing=timing)


def _stream_of(torch: Any, device: Any, generic: bool) -> Callable[[], Any] | None:
    """What a step records on: None is the current stream (found in C++ by
    ``torch.Event.record()``)."""
    if device.type == "mps" or device.index is None:
        # MPS has one stream per device; else the current stream of the current device
        return None
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "current_stream"):
        return functools.partial(torch.accelerator.current_stream, device.index)
    index, current_stream = device.index, module.current_stream
    if not generic:
        return functools.partial(current_stream, index)
    current_device = module.current_device

    # the named device is the current one (the usual case): no Stream object
    def stream() -> Any:
        return None if current_device() == index else current_stream(index)

    return stream


def resolve_events(
    device: Any = None,
    *,
    streams: Sequence[Any] | None = None,
    blocking: bool = False,
    timing: bool = False,
) -> EventFactory | None:
    """An event factory for ``device``, or None when its work runs synchronously (the CPU).

    Args:
        device: None (auto-detect), a device string, or a ``torch.device``.
        streams: record one event per stream on these streams instead of the
            current stream; a step completes when all of them have (a non-empty list of
            ``torch.Stream`` s, checked by ``_options.check_streams`` on every backend).
        blocking: CUDA blocking-sync events (``synchronize()`` sleeps in the driver).
        timing: events that support ``elapsed_time``.

    The factory reuses events (:class:`~asyncthrottle.pool.EventPool`): an
    event is re-recorded only once nothing refers to it any more, so a loop at
    depth ``d`` keeps about ``d`` events however many steps it runs. CUDA,
    XPU and other accelerators record ``torch.Event`` on the current stream
    (found in C++: no Python ``Stream`` object per step); ``blocking=True``
    uses ``torch.cuda.Event``, since ``torch.Event`` ignores ``blocking``.

    Raises:
        RuntimeError: an explicitly requested device is not available.
    """
    if device_kind(device) == "jax":
        if streams is not None:
            raise ValueError(
                "streams= does not apply to JAX devices; cover other devices with "
                "asyncthrottle.jax.barrier_on()"
            )
        from .jax import jax_events

        return jax_events(device, timing=timing)
    torch_device = parse_torch_device(device if device is not None else detect_device())
    if torch_device.type == "cpu":
        if streams:
            raise ValueError("streams= was given but the device is the CPU, which has no streams; "
                             "drop streams=")
        return None
    torch = _torch()
    if not _is_available(torch, torch_device.type):
        raise RuntimeError(
            f"device={str(torch_device)!r} was requested but is not available here "
            f"(torch.{torch_device.type}.is_available() is False); pass device=None to auto-detect "
            "or device='cpu'"
        )
    raw = _raw_factory(torch, torch_device, blocking=blocking, timing=timing)
    kind = torch_device.type
    capturing = torch.cuda.is_current_stream_capturing if kind == "cuda" else None
    # CUDA and XPU: the stream that side streams (deferred tensors' copies) are joined to, and the
    # device whose current stream the events record on: the named one, else the current one (C
    # calls: partial(int, k) returns k; _cuda_getDevice is torch.cuda.current_device's own)
    current: Callable[[], Any] | None = None
    device_index: Callable[[], int] | None = None
    if kind in ("cuda", "xpu"):
        module = getattr(torch, kind)
        current = functools.partial(module.current_stream, torch_device.index)
        device_index = (getattr(torch._C, f"_{kind}_getDevice", module.current_device)
                        if torch_device.index is None
                        else functools.partial(int, torch_device.index))
    if streams is None:
        generic = getattr(raw, "func", None) is getattr(torch, "Event", False)
        on = _stream_of(torch, torch_device, generic)
        return EventPool(lambda: TorchEvent(raw(), on, capturing, current, device_index))
    if torch_device.type == "mps":
        raise ValueError("streams= does not apply to MPS, which has one stream per device; drop "
                         "streams=")
    # (checked by _options.check_streams: a non-empty list of streams)
    fixed = tuple(streams)
    return EventPool(lambda: MultiEvent([TorchEvent(raw(), stream, capturing) for stream in fixed]))


def device_kind(device: Any = None) -> str:
    """The backend ``resolve_events(device)`` picks: ``"cpu"``, ``"cuda"``, ``"mps"``, ``"jax"``,
    ..."""
    if (
        (isinstance(device, str) and device.split(":")[0] == "jax")
        or type(device).__module__.startswith("jax")
    ):
        return "jax"
    return str(parse_torch_device(device if device is not None else detect_device()).type)


def cuda_module() -> Any:
    """``torch.cuda`` when a CUDA device is available, else None (tests replace this)."""
    try:
        torch = _torch()
    except ImportError:
        return None
    return torch.cuda if torch.cuda.is_available() else None


def mover(
    to: Any, kind: str, device: Any, *, synchronous: bool, streams: Any = None
) -> tuple[Any, Any]:
    """``to=`` on a throttle of backend ``kind``: ``(target torch.device, CudaCopy or None)``; see
    ``Backend.mover``.

    ``streams`` are the throttle's ``streams=``: each batch's copy is ordered before every one of
    them.
    """
    torch = _torch()
    target = parse_torch_device(to, "to")
    if kind not in ("events", target.type):
        raise ValueError(
            f"to={to!r} moves batches to {target.type}, but the throttle runs on {kind} "
            f"(device={device!r}); the throttle's events must cover the steps that read the "
            "batches: pass the same device to both"
        )
    if target.type != "cpu" and not _is_available(torch, target.type):
        known = hasattr(torch, target.type)
        why = (
            f"torch.{target.type}.is_available() is False" if known else "torch has no such backend"
        )
        raise RuntimeError(
            f"to={to!r} was requested but {target.type} is not available here ({why}); "
            "pass to=None to leave batches where the source puts them, or to='cpu'"
        )
    if synchronous or target.type != "cuda":
        return target, None
    target = torch.device(
        "cuda", torch.cuda.current_device() if target.index is None else target.index
    )
    if kind == "cuda":
        index = torch.device(device).index if device is not None else None
        if (torch.cuda.current_device() if index is None else index) != target.index:
            raise ValueError(
                f"to={to!r} is cuda:{target.index} but the throttle records on device={device!r}; "
                "its events must cover the steps that read the batches: pass the same device to "
                "both"
            )
    from .copies import CudaCopy

    return target, CudaCopy(target, streams=streams)
