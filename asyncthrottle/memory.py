"""``max_memory=``: a memory budget the host must be under before a step is handed out, and the probes that read it.

Depth bounds memory only indirectly: what a queued step holds is the pinned
host memory of its batch (PyTorch's caching host allocator keeps a block until
the events recorded after its copies complete), buffers on side streams, and
under XLA the outputs of queued programs. :class:`MemoryBudget` is a part of
the throttle that uses the core's ``holds()`` hook: before a hand-out, while
the probe reports more than ``max_memory`` bytes and steps are in flight, the
host waits for the oldest one. With nothing in flight a step always goes (the
budget cannot be met by waiting).

Default probes (``memory=None``), read once per hand-out and after each wait:

* CUDA: pinned host memory held by live blocks (``torch.cuda.host_memory_stats()``,
  read as :mod:`asyncthrottle.pinned` explains for each torch version; 0 before
  CUDA is initialised or on torch < 2.7, which lacks the statistics) plus the
  device's reserved memory (``memory_reserved``, which the caching allocator
  keeps once grown: a budget must leave room for it).
* JAX: the device's ``memory_stats()["bytes_in_use"]``; backends that report
  nothing (the CPU) need ``memory=``, e.g. :func:`rss_bytes`.
* The CPU (synchronous): none; nothing is ever in flight there.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any

from .pinned import bytes_trusted, log_untrusted, pinned_in_use

__all__ = ["MemoryBudget", "cuda_probe", "default_probe", "jax_probe", "pinned_in_use", "resolve_budget", "rss_bytes"]

MemoryProbe = Callable[[], int]
_log = logging.getLogger("asyncthrottle")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryBudget:
    """A part that holds back a hand-out while ``probe()`` reports more than ``max_memory`` bytes.

    Args:
        max_memory: the budget in bytes.
        probe: a zero-argument callable returning the bytes held now.

    Attributes:
        waits: times the budget made the host wait for the oldest step (a
            real wait: an oldest step already complete when the budget was
            over is retired without one, and not counted).
        over: hand-outs at which the probe still reported more than the
            budget (only possible with nothing in flight: the budget is below
            what the loop holds without any queued step).
        peak: the most bytes the probe reported at a hand-out (None before the first).
        last: the latest reading.
    """

    def __init__(self, max_memory: int, probe: MemoryProbe) -> None:
        self.max_memory, self.probe = max_memory, probe
        self.waits = self.over = 0
        self.peak: int | None = None
        self.last: int | None = None
        self.at: dict[int, int] = {}  # steps in flight at a hand-out -> the latest reading there
        self._fresh = False  # `last` was read for the hand-out under way
        self._holding = False  # the last holds() said over: the next wait is the budget's

    def read(self) -> int:
        """Call the probe, checking what it returns."""
        value = self.probe()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise TypeError(
                f"the memory probe {self.probe!r} must return the bytes held as a number >= 0, got {value!r}"
            )
        self.last = int(value)
        return self.last

    def holds(self) -> bool:
        """Before a hand-out, with steps in flight: over the budget means wait for the oldest."""
        over = self.read() > self.max_memory
        self._fresh = not over  # after a wait, the hand-out's reading is taken afresh
        self._holding = over  # a wait that follows is the budget's (the core waits only if the step is unfinished)
        return over

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        """The host waited: count it when the budget asked for it (an oldest step already done costs no wait)."""
        if self._holding:
            self._holding = False
            self.waits += 1

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        reading = self.last if self._fresh and self.last is not None else self.read()
        self._fresh = self._holding = False
        self.at[in_flight] = reading
        if reading > self.max_memory:
            self.over += 1
        if self.peak is None or reading > self.peak:
            self.peak = reading

    def room_for(self, in_flight: int) -> bool:
        """Whether hand-outs with ``in_flight`` steps in flight are likely to fit in the budget.

        Extrapolates the readings at ``in_flight - 1`` and ``in_flight - 2``
        steps by one more step's growth; True when there are not two readings
        to go by (the budget is enforced at each hand-out anyway).
        """
        one, two = self.at.get(in_flight - 1), self.at.get(in_flight - 2)
        if one is None or two is None:
            return True
        return one + max(0, one - two) <= self.max_memory


def rss_bytes() -> int:
    """The resident memory of this process (Linux ``/proc/self/statm``): a probe for the CPU and JAX on the CPU."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:  # not Linux: the peak, the best the resource module offers
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
    host_stats = getattr(cuda, "host_memory_stats_as_nested_dict", None) or getattr(cuda, "host_memory_stats", None)
    trusted = bytes_trusted(torch.__version__)
    if host_stats is None:
        _log.warning("asyncthrottle: torch %s has no torch.cuda.host_memory_stats() (torch >= 2.7 has): max_memory's "
                     "CUDA probe sees device memory only; pass memory= to count pinned host memory", torch.__version__)
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
    from .jax import _jax, _parse_device

    target = _parse_device(_jax(), device)
    stats = target.memory_stats()
    if not stats or "bytes_in_use" not in stats:
        raise ValueError(
            f"max_memory: the JAX device {target} reports no memory_stats() (got {stats!r}), so there is no "
            "default probe; pass memory=, e.g. memory=asyncthrottle.memory.rss_bytes for this process's resident memory"
        )

    def probe() -> int:
        return int(target.memory_stats()["bytes_in_use"])

    return probe


def default_probe(kind: str, device: Any) -> MemoryProbe:
    """The probe ``max_memory`` uses when ``memory=`` is not given, for backend ``kind``.

    Raises:
        ValueError: the backend has no default probe (the CPU, MPS, XPU, custom ``events=``).
    """
    if kind == "cuda":
        return cuda_probe(device)
    if kind == "jax":
        return jax_probe(device)
    raise ValueError(
        f"max_memory needs memory= on this backend ({kind}): there is no default memory probe for it; pass "
        "memory=<a zero-argument callable returning the bytes held>, e.g. asyncthrottle.memory.rss_bytes"
    )


def resolve_budget(max_memory: object, memory: object, kind: str, device: Any) -> MemoryBudget | None:
    """Check ``max_memory=``/``memory=`` and build the budget part (None when there is no budget).

    Args:
        max_memory: bytes, an int > 0, or None.
        memory: a zero-argument callable returning bytes, or None for the backend's default probe.
        kind: the backend (``"cuda"``, ``"jax"``, ``"cpu"``, ``"events"`` for ``events=``).
        device: the ``device=`` option, for the default probe.
    """
    if max_memory is None:
        if memory is not None:
            raise ValueError(
                f"memory={memory!r} was given without max_memory=; pass max_memory=<bytes> to set a budget "
                "(the probe alone does nothing)"
            )
        return None
    if isinstance(max_memory, bool) or not isinstance(max_memory, (int, float)):
        raise TypeError(f"max_memory must be a number of bytes > 0 or None, got {max_memory!r}")
    if not max_memory > 0 or math.isinf(max_memory):  # also rejects NaN
        raise ValueError(f"max_memory must be a finite number of bytes > 0 or None, got {max_memory!r}; e.g. 2 * 2**30")
    if memory is not None and not callable(memory):
        raise TypeError(f"memory must be a zero-argument callable returning the bytes held, got {memory!r}")
    probe = memory if memory is not None else default_probe(kind, device)
    return MemoryBudget(int(max_memory), probe)  # type: ignore[arg-type]
