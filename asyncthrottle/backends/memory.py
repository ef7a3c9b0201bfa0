"""Memory probes: the bytes a backend holds, read without a sync (``max_memory=``'s default probes).

Default probes, read once per hand-out and after each wait:

* CUDA: pinned host memory held by live blocks (``torch.cuda.host_memory_stats()``,
  read as :mod:`asyncthrottle.backends.pinned` explains for each torch version; 0
  before CUDA is initialised or on torch < 2.7, which lacks the statistics) plus the
  device's reserved memory (``memory_reserved``, which the caching allocator keeps
  once grown: a budget must leave room for it).
* JAX: the device's ``memory_stats()["bytes_in_use"]``; backends that report
  nothing (the CPU) need a probe (``MemoryBudget(bytes, probe=...)``), e.g. :func:`rss_bytes`.
* The CPU (synchronous): none; nothing is ever in flight there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from .pinned import bytes_trusted, log_untrusted, pinned_in_use

__all__ = ["MemoryProbe", "cuda_probe", "jax_probe", "pinned_in_use", "rss_bytes"]

MemoryProbe = Callable[[], int]
_log = logging.getLogger("asyncthrottle")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """The resident memory of this process (Linux ``/proc/self/statm``): a probe for the CPU and JAX
    on the CPU."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    # not Linux: the peak, the best the resource module offers
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cuda_probe(device: Any) -> MemoryProbe:
    """Pinned host memory held by live blocks plus ``device``'s reserved memory, in bytes.

    The pinned part is :func:`asyncthrottle.pinned.pinned_in_use`: read directly on
    torch >= 2.14, estimated from block counts before (where torch's byte count
    never falls; said once in the log); 0 on torch < 2.7, which has no such
    statistics (also said once: the budget then sees device memory only).
    """
    import torch

    cuda = torch.cuda
    host_stats = (
        getattr(cuda, "host_memory_stats_as_nested_dict", None)
        or getattr(cuda, "host_memory_stats", None)
    )
    trusted = bytes_trusted(torch.__version__)
    if host_stats is None:
        _log.warning("asyncthrottle: torch %s has no torch.cuda.host_memory_stats() (torch >= 2.7 "
                     "has): max_memory's CUDA probe sees device memory only; pass "
                     "max_memory=MemoryBudget(<bytes>, probe=...) to count pinned host memory",
                     torch.__version__)
    elif not trusted:
        log_untrusted(torch.__version__)

    def probe() -> int:
        pinned = pinned_in_use(host_stats(), trust_bytes=trusted) if host_stats is not None else 0
        return pinned + int(cuda.memory_reserved(device))

    return probe


def jax_probe(device: Any) -> MemoryProbe:
    """``device.memory_stats()["bytes_in_use"]`` for a JAX device.

    Raises:
        ValueError: the backend reports no memory statistics (JAX on the CPU).
    """
    from .jax import _jax, parse_jax_device

    target = parse_jax_device(_jax(), device)
    stats = target.memory_stats()
    if not stats or "bytes_in_use" not in stats:
        raise ValueError(
            f"max_memory: the JAX device {target} reports no memory_stats() (got {stats!r}), so "
            "there is no default probe; pass max_memory=MemoryBudget(<bytes>, probe=...), e.g. "
            "probe=asyncthrottle.memory.rss_bytes for this process's resident memory"
        )

    def probe() -> int:
        return int(target.memory_stats()["bytes_in_use"])

    return probe
