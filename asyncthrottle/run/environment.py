"""Where a run ran, as a bug report needs it: the report's ``environment`` (date, Python, torch,
the device and its name, the OS, asyncthrottle's version, the rank and the world size)."""

from __future__ import annotations

import datetime
import platform
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["environment"]


def environment(device: Any, rank: tuple[int, int] | None, *, on_host: bool = False,
                now: Callable[[], datetime.datetime] | None = None) -> dict[str, Any]:
    """The report's ``environment``: ``device`` is the steps' device (a ``torch.device`` or its
    name; None: no step found it), ``on_host`` whether it is the host's processor (the steps'
    throttle is synchronous), ``rank`` ``(rank, world size)`` under torchrun (None: one
    process). Nothing is initialised here that the script did not: a device's name is asked of
    torch only for the device the steps ran on, and torch's version only where the script
    imported it."""
    from .. import __version__

    torch = sys.modules.get("torch")
    stamp = now() if now is not None else datetime.datetime.now(datetime.timezone.utc)
    where = str(device) if device is not None else None
    return {
        "date": stamp.isoformat(timespec="seconds"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": str(getattr(torch, "__version__", "")) or None,
        "device": where,
        "device_name": (_cpu_name() if on_host else _device_name(torch, where))
        if where is not None else None,
        "os": platform.platform(),
        "asyncthrottle": __version__,
        "rank": rank[0] if rank is not None else 0,
        "world_size": rank[1] if rank is not None else 1,
    }


def _device_name(torch: Any, device: str) -> str | None:
    """The name of an accelerator (``"cuda:0"``), asked of its torch module
    (``torch.cuda.get_device_name``); None where it is not known."""
    module = getattr(torch, device.partition(":")[0], None)
    name = getattr(module, "get_device_name", None)
    if not callable(name):
        return None
    try:
        return str(name(device))
    except Exception:  # a name is worth less than the report
        return None


def _cpu_name() -> str | None:
    """The processor's model (Linux's ``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None
