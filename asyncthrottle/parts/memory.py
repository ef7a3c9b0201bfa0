"""``max_memory=``: a memory budget the host must be under before a step is handed out.

Depth bounds memory only indirectly: what a queued step holds is the pinned
host memory of its batch (PyTorch's caching host allocator keeps a block until
the events recorded after its copies complete), buffers on side streams, and
under XLA the outputs of queued programs. ``max_memory=`` takes the bytes, or
a :class:`MemoryBudget` (the bytes and the probe that reads them);
:class:`MemoryGate` is the part of the throttle that enforces it through the
core's ``holds()`` hook: before a hand-out, while the probe reports more than
the budget and steps are in flight, the host waits for the oldest one. With
nothing in flight a step always goes (the budget cannot be met by waiting).

The default probes (``probe=None``) are the backend's: see
:mod:`asyncthrottle.backends.memory`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import Option, check_callable, check_positive
from ..backends.memory import MemoryProbe
from ._build import Part

if TYPE_CHECKING:
    from ..stats import Stats
    from ._build import Build


_BYTES = "a number of bytes > 0"
_PROBE = "a zero-argument callable returning the bytes held, or None (the backend's)"


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """``max_memory=MemoryBudget(bytes, probe=...)``: a memory budget and the probe that reads it.

    Before each hand-out, while ``probe()`` reports more than ``bytes`` and steps are in flight,
    the host waits for the oldest step (docs/auto-depth.md). ``max_memory=<bytes>`` is
    ``MemoryBudget(bytes)``: the backend's probe.

    Example:
        >>> import asyncthrottle as at
        >>> from asyncthrottle.memory import rss_bytes
        >>> budget = at.MemoryBudget(rss_bytes() + 2**30, probe=rss_bytes)
        >>> at.Throttle(2, device="cpu", max_memory=budget).stats.max_memory == budget.bytes
        True

    Args:
        bytes: the budget, a number of bytes > 0.
        probe: a zero-argument callable returning the bytes held now; None: the backend's
            (CUDA: pinned host memory in use plus reserved device memory; JAX:
            ``memory_stats()``; the CPU and ``events=`` have none: pass one, e.g.
            ``asyncthrottle.memory.rss_bytes``). A wrong type raises ``TypeError``, a wrong
            value ``ValueError``.
    """

    bytes: int | float
    probe: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        if self.bytes is None:
            raise TypeError(f"MemoryBudget bytes must be {_BYTES}, got None; e.g. "
                            "MemoryBudget(2 * 2**30), or max_memory=None for no budget")
        check_positive("MemoryBudget bytes", self.bytes, rule=_BYTES,
                       fix="e.g. MemoryBudget(2 * 2**30)")
        check_callable("MemoryBudget probe", self.probe, rule=_PROBE,
                       fix="e.g. probe=asyncthrottle.memory.rss_bytes")


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """The fields of :class:`~asyncthrottle.Stats` that a ``max_memory`` budget supplies."""

    max_memory: int | None = None
    memory_peak: int | None = None
    memory_waits: int = 0
    memory_over: int = 0


def check_max_memory(max_memory: object) -> Any:
    """``max_memory=``: bytes > 0, a :class:`MemoryBudget` or None."""
    if isinstance(max_memory, MemoryBudget):
        return max_memory
    return check_positive("max_memory", max_memory, rule=f"{_BYTES}, a MemoryBudget or None",
                          fix="e.g. max_memory=2 * 2**30")


class MemoryGate(Part):
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

    PLACE = 30
    OPTIONS = (
        Option("max_memory", "int | MemoryBudget | None", None,
               "a memory budget: bytes (the backend's probe), or "
               "`at.MemoryBudget(bytes, probe=...)`",
               "[`depth=\"auto\"` and memory](auto-depth.md)",
               lambda name, value: check_max_memory(value), wrong_type=("1GB", MemoryBudget),
               wrong_value=(-1,),
               help=('a memory budget: before a hand-out, wait for the oldest steps while the '
                     'memory probe reports more (or until nothing is in flight). Bytes (the '
                     "backend's probe: CUDA's pinned host memory in use plus reserved device "
                     "memory, JAX's ``memory_stats()``; the CPU and ``events=`` have none) or a "
                     ':class:`~asyncthrottle.MemoryBudget` (the bytes and your probe).')),
        Option("memory", "Callable[[], int] | None", None, "the budget's probe", "",
               functools.partial(check_callable,
                                 rule="a zero-argument callable returning the bytes held",
                                 fix="e.g. max_memory=MemoryBudget(2 * 2**30, probe=rss_bytes)"),
               wrong_type=(5,), wrong_value=(lambda: 0,),
               deprecated="`max_memory=at.MemoryBudget(bytes, probe=...)`",
               help='deprecated (it goes in 0.5): ``max_memory=MemoryBudget(bytes, probe=...)``.'),
    )
    STATS = MemoryStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        """``memory=`` (before 0.4; goes in 0.5), the probe, needs ``max_memory=`` in bytes: now
        ``MemoryBudget(bytes, probe=...)``."""
        max_memory, memory = options["max_memory"], options["memory"]
        if memory is None:
            return
        if max_memory is None:
            raise ValueError(
                f"memory={memory!r} was given without max_memory=; pass "
                "max_memory=asyncthrottle.MemoryBudget(<bytes>, probe=...) to set a budget (the "
                "probe alone does nothing)"
            )
        if isinstance(max_memory, MemoryBudget):
            raise ValueError(f"memory={memory!r} and max_memory={max_memory!r} both give the "
                             "budget's probe; drop memory=")
        warn_at_user(f"memory= is deprecated (it goes in 0.5): pass "
                     f"max_memory=asyncthrottle.MemoryBudget({max_memory!r}, probe={memory!r})",
                     DeprecationWarning)

    @classmethod
    def build(cls, at: Build) -> MemoryGate | None:
        budget = at.options["max_memory"]
        if budget is None:
            return None
        if not isinstance(budget, MemoryBudget):
            budget = MemoryBudget(budget, probe=at.options["memory"])
        probe = budget.probe if budget.probe is not None else at.backend.memory_probe()
        return cls(int(budget.bytes), probe)

    def fields(self) -> dict[str, Any]:
        return {"max_memory": self.max_memory, "memory_peak": self.peak, "memory_waits": self.waits,
                "memory_over": self.over}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if stats.max_memory is None:
            return []
        peak = "-" if stats.memory_peak is None else f"{stats.memory_peak / 2**20:,.1f} MiB"
        return [
            f"  memory: budget {stats.max_memory / 2**20:,.1f} MiB, peak at a hand-out {peak}, "
            f"{stats.memory_waits} waits for it, {stats.memory_over} hand-outs over it with "
            "nothing in flight"
        ]

    def __init__(self, max_memory: int, probe: MemoryProbe) -> None:
        self.max_memory, self.probe = max_memory, probe
        self.waits = self.over = 0
        self.peak: int | None = None
        self.last: int | None = None
        # steps in flight at a hand-out -> the latest reading there
        self.at: dict[int, int] = {}
        # `last` was read for the hand-out under way
        self._fresh = False
        # the last holds() said over: the next wait is the budget's
        self._holding = False

    def read(self) -> int:
        """Call the probe, checking what it returns."""
        value = self.probe()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise TypeError(
                f"the memory probe {self.probe!r} must return the bytes held as a number >= 0, got "
                f"{value!r}"
            )
        self.last = int(value)
        return self.last

    def holds(self) -> bool:
        """Before a hand-out, with steps in flight: over the budget means wait for the oldest."""
        over = self.read() > self.max_memory
        # after a wait, the hand-out's reading is taken afresh
        self._fresh = not over
        # a wait that follows is the budget's (the core waits only if the step is unfinished)
        self._holding = over
        return over

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        """The host waited: count it when the budget asked for it (an oldest step already done costs
        no wait)."""
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
