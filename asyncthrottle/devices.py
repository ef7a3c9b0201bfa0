"""Event backends for PyTorch devices: CUDA, MPS, XPU, ``torch.Event``, and the CPU."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from .events import EventFactory, MultiEvent

__all__ = ["detect_device", "device_kind", "resolve_events"]

_NAMED = ("cuda", "xpu", "mps")


def _torch() -> Any:
    import torch  # deferred: `import asyncthrottle` stays cheap

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
    for name in _NAMED:  # torch < 2.6
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


def _parse_device(device: Any) -> Any:
    torch = _torch()
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"device must be None, a str such as 'cuda' or 'cuda:1', or a torch.device, got {type(device).__name__}"
        )
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(
            f"device={device!r} is not a device torch knows ({exc}); try 'cuda', 'mps', 'xpu' or 'cpu'"
        ) from None


class TorchEvent:
    """A torch event recorded on a stream chosen at record time.

    Args:
        event: the torch event (``torch.cuda.Event``, ``torch.Event``, ...).
        stream: a fixed stream, or a zero-argument callable returning the stream
            to record on, or None for the current stream of the current device.
        capturing: a callable that is True while a CUDA graph is being captured.
    """

    __slots__ = ("_after", "_capturing", "_current", "_event", "_stream")

    def __init__(
        self,
        event: Any,
        stream: Any = None,
        capturing: Callable[[], bool] | None = None,
        current: Callable[[], Any] | None = None,
    ) -> None:
        self._event, self._stream, self._capturing, self._current = event, stream, capturing, current
        self._after: list[Any] = []

    def wait_stream(self, stream: Any) -> None:
        """Order this event after the work enqueued on ``stream`` so far (joined when it is recorded).

        Deferred values copied on a side stream use it, so the step's event covers their copies.
        """
        self._after.append(stream)

    def record(self) -> None:
        if self._capturing is not None and self._capturing():
            raise RuntimeError(
                "asyncthrottle cannot record an event while a CUDA graph is being captured on the current "
                "stream: call the throttle (its wrapper's next(), step(), mark(), drain()) outside the "
                "captured region, e.g. around graph.replay()"
            )
        stream = self._stream() if callable(self._stream) else self._stream
        if self._after:
            target = stream if stream is not None else self._current() if self._current is not None else None
            for other in self._after:
                if target is not None and other != target:
                    target.wait_stream(other)  # enqueues a wait on the device; never blocks the host
            self._after = []
        if stream is None:
            self._event.record()
        else:
            self._event.record(stream)

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()  # host-device sync: the caller chose to block.

    def elapsed_time(self, end: TorchEvent) -> float:
        return float(self._event.elapsed_time(end._event))


def _raw_factory(torch: Any, device: Any, *, blocking: bool, timing: bool) -> Callable[[], Any]:
    kind = device.type
    if kind == "cuda":
        return functools.partial(torch.cuda.Event, enable_timing=timing, blocking=blocking)
    if kind == "mps":
        return functools.partial(torch.mps.event.Event, enable_timing=timing)
    if kind == "xpu":
        return functools.partial(torch.xpu.Event, enable_timing=timing)
    if not hasattr(torch, "Event"):
        raise RuntimeError(f"device={str(device)!r} needs torch.Event (torch >= 2.4); upgrade torch")
    return functools.partial(torch.Event, device=device, enable_timing=timing)


def _current_stream(torch: Any, device: Any) -> Callable[[], Any] | None:
    if device.type == "mps":
        return None  # one stream per device; torch.mps.event.Event.record() takes no stream
    if device.index is None:
        return None  # the current stream of the current device
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "current_stream"):
        return functools.partial(module.current_stream, device.index)
    return functools.partial(torch.accelerator.current_stream, device.index)


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
            current stream; a step completes when all of them have.
        blocking: CUDA blocking-sync events (``synchronize()`` sleeps in the driver).
        timing: events that support ``elapsed_time``.

    Raises:
        RuntimeError: an explicitly requested device is not available.
    """
    if device_kind(device) == "jax":
        if streams is not None:
            raise ValueError(
                "streams= does not apply to JAX devices; cover other devices with asyncthrottle.jax.barrier_on()"
            )
        from .jax import jax_events

        return jax_events(device, timing=timing)
    torch_device = _parse_device(device if device is not None else detect_device())
    if torch_device.type == "cpu":
        if streams:
            raise ValueError("streams= was given but the device is the CPU, which has no streams; drop streams=")
        return None
    torch = _torch()
    if not _is_available(torch, torch_device.type):
        raise RuntimeError(
            f"device={str(torch_device)!r} was requested but is not available here "
            f"(torch.{torch_device.type}.is_available() is False); pass device=None to auto-detect or device='cpu'"
        )
    raw = _raw_factory(torch, torch_device, blocking=blocking, timing=timing)
    cuda = torch_device.type == "cuda"
    capturing = torch.cuda.is_current_stream_capturing if cuda else None
    current_cuda = functools.partial(torch.cuda.current_stream, torch_device.index) if cuda else None
    if streams is None:
        current = _current_stream(torch, torch_device)
        return lambda: TorchEvent(raw(), current, capturing, current_cuda)
    if torch_device.type == "mps":
        raise ValueError("streams= does not apply to MPS, which has one stream per device; drop streams=")
    if isinstance(streams, (str, bytes)) or not isinstance(streams, Sequence) or not streams:
        raise ValueError(f"streams must be a non-empty list of streams, got {streams!r}")
    fixed = tuple(streams)
    return lambda: MultiEvent([TorchEvent(raw(), stream, capturing) for stream in fixed])


def device_kind(device: Any = None) -> str:
    """The backend ``resolve_events(device)`` picks: ``"cpu"``, ``"cuda"``, ``"mps"``, ``"jax"``, ..."""
    if (isinstance(device, str) and device.split(":")[0] == "jax") or type(device).__module__.startswith("jax"):
        return "jax"
    return str(_parse_device(device if device is not None else detect_device()).type)
