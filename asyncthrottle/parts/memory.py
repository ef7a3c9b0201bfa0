"""``max_memory=``: a memory budget the host must be under before a step is handed out.

Depth bounds memory only indirectly: what a queued step holds is the pinned
host memory of its batch (PyTorch's caching host allocator keeps a block until
the events recorded after its copies complete), buffers on side streams, and
under XLA the outputs of queued programs. :class:`MemoryBudget` is a part of
the throttle that uses the core's ``holds()`` hook: before a hand-out, while
the probe reports more than ``max_memory`` bytes and steps are in flight, the
host waits for the oldest one. With nothing in flight a step always goes (the
budget cannot be met by waiting).

The default probes (``memory=None``) are the backend's: see
:mod:`asyncthrottle.backends.memory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._options import check_callable, check_positive
from ..backends.memory import MemoryProbe
from ._build import Part

if TYPE_CHECKING:
    from ..stats import Stats
    from ._build import Build


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """The fields of :class:`~asyncthrottle.Stats` that a ``max_memory`` budget supplies."""

    max_memory: int | None = None
    memory_peak: int | None = None
    memory_waits: int = 0
    memory_over: int = 0


class MemoryBudget(Part):
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

    OPTIONS = ("max_memory", "memory")
    STATS = MemoryStats

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        max_memory, memory = options["max_memory"], options["memory"]
        check_positive("max_memory", max_memory, rule="a number of bytes > 0 or None",
                       fix="e.g. max_memory=2 * 2**30")
        check_callable("memory", memory, rule="a zero-argument callable returning the bytes held",
                       fix="e.g. memory=asyncthrottle.memory.rss_bytes")
        if max_memory is None and memory is not None:
            raise ValueError(
                f"memory={memory!r} was given without max_memory=; pass max_memory=<bytes> to set "
                "a budget (the probe alone does nothing)"
            )

    @classmethod
    def build(cls, at: Build) -> MemoryBudget | None:
        max_memory, memory = at.options["max_memory"], at.options["memory"]
        if max_memory is None:
            return None
        budget = cls(int(max_memory), memory if memory is not None else at.backend.memory_probe())
        at.core.subscribe(budget)
        return budget

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
