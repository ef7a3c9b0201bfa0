"""The opt-in parts of a throttle: one feature per module, built in the order of :data:`PARTS`.

A part brings its own option check, its :class:`~asyncthrottle.Stats` fields and
its hooks, which the throttle subscribes (see :class:`~asyncthrottle.parts._build.Part`).
Adding one touches its module, the two lists below and its page of the docs.
"""

from __future__ import annotations

import dataclasses

from .autodepth import AutoDepthStats, DepthController
from .memory import MemoryGate, MemoryStats
from .nonfinite import NonFiniteStats, NonFiniteWatch
from .prefetch import Prefetch, PrefetchStats
from .profiling import NvtxRanges, ProfilerRanges
from .ranks import RankScores, RankStats
from .sections import Sections, SectionStats
from .stall import StallStats, StallWatch
from .syncdetect import SyncDetect, SyncStats
from .timing import DeviceTiming, TimingStats
from .trace import Trace

# Built in this order (a part may use the parts before it: ``Build.part``), told of each
# notification in this order, and shown in this order by ``Stats.summary()``.
PARTS = (
    DeviceTiming, Sections, MemoryGate, DepthController, StallWatch, RankScores, Prefetch,
    ProfilerRanges, NvtxRanges, Trace, SyncDetect, NonFiniteWatch,
)


@dataclasses.dataclass(frozen=True)
class PartStats(SyncStats, NonFiniteStats, PrefetchStats, MemoryStats, RankStats, SectionStats,
                StallStats, AutoDepthStats, TimingStats):
    """The parts' fields of :class:`~asyncthrottle.Stats` (a dataclass lists the last base's fields
    first)."""
