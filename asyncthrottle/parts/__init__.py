"""The opt-in parts of a throttle: one feature per module, built in the order of :data:`PARTS`.

A part brings its options (each declared once: :data:`OPTIONS` gathers them), its
:class:`~asyncthrottle.Stats` fields and its hooks, which the throttle subscribes (see
:class:`~asyncthrottle.parts._build.Part`).

The few public methods of a part that a :class:`~asyncthrottle.Throttle` entry point forwards to are
part of that protocol too, each named here: ``Sections.section(name, collective)``
(``Throttle.section``), ``Trace.export(path, meta)`` (``export_trace``), ``SyncDetect.audit``
(``sync_audit``) and ``Prefetch.mover(to)`` (``wrap(to=)``). The throttle finds a part by its class
(``Lifecycle.part``) and calls these; nothing outside a part's module touches its private state
(``tests/test_architecture.py`` holds every module to that).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._options import CORE_OPTIONS, Option
from ._build import Build
from .autodepth import AutoDepthStats, DepthController
from .memory import MemoryGate, MemoryStats
from .nonfinite import NonFiniteStats, NonFiniteWatch
from .prefetch import Prefetch, PrefetchStats
from .profiling import NvtxRanges, ProfilerRanges
from .ranks import RankScores, RankStats
from .samples import SampleRate, SampleStats
from .sections import Sections, SectionStats
from .stall import StallStats, StallWatch
from .syncdetect import SyncDetect, SyncStats
from .timing import DeviceTiming, TimingStats
from .trace import Trace

# Built in this order (a part may use the parts before it: ``Build.part``), told of each
# notification in this order, and shown in this order by ``Stats.summary()``.
PARTS = (
    DeviceTiming, Sections, MemoryGate, DepthController, StallWatch, RankScores, Prefetch,
    ProfilerRanges, NvtxRanges, Trace, SyncDetect, NonFiniteWatch, SampleRate,
)
# every keyword of the Throttle, each declared once: the core's, then each part's
OPTIONS: tuple[Option, ...] = (
    *CORE_OPTIONS, *(option for part in PARTS for option in part.OPTIONS),
)


@dataclasses.dataclass(frozen=True)
class PartStats(SampleStats, SyncStats, NonFiniteStats, PrefetchStats, MemoryStats, RankStats,
                SectionStats, StallStats, AutoDepthStats, TimingStats):
    """The parts' fields of :class:`~asyncthrottle.Stats` (a dataclass lists the last base's fields
    first)."""


def build(at: Build) -> dict[type, Any]:
    """The parts these options turn on, by class: built in the order of :data:`PARTS` (a part may
    use the ones before it), then subscribed to the core in that order (the one way a part
    subscribes)."""
    for part in PARTS:
        built = part.build(at)
        if built is not None:
            at.built[part] = built
    for built in at.built.values():
        at.core.subscribe(built)
    return at.built
