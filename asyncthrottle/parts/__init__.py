"""The opt-in parts of a throttle: one feature per module, built in the order of :data:`PARTS`.

A part is a :class:`~asyncthrottle.parts._build.Part` with a ``PLACE`` in a module of its own
here. It brings its options (each declared once: :data:`OPTIONS` gathers them), its
:class:`~asyncthrottle.Stats` fields and its hooks, which the throttle subscribes. What a static
type needs listed (:data:`PARTS` in the parts' order, ``PartStats``'s bases, ``Throttle``'s
signature and its ``Args``) is written from those declarations into ``_declared.py`` by
``python -m asyncthrottle.parts._declare``; ``tests/test_declared.py`` fails while it is stale.

The few public methods of a part that a :class:`~asyncthrottle.Throttle` entry point forwards to are
part of that protocol too, each named here: ``Sections.section(name, collective)``
(``Throttle.section``), ``Trace.export(path, meta)`` (``export_trace``), ``SyncDetect.audit``
(``sync_audit``) and ``Prefetch.mover(to)`` (``wrap(to=)``). The throttle finds a part by its class
(``Lifecycle.part``) and calls these; nothing outside a part's module touches its private state
(``tests/test_architecture.py`` holds every module to that).
"""

from __future__ import annotations

from typing import Any

from .._options import CORE_OPTIONS, Option
from ._build import Build
from ._declared import PARTS, PartStats

__all__ = ["OPTIONS", "PARTS", "PartStats", "build"]

# every keyword of the Throttle, each declared once: the core's, then each part's
OPTIONS: tuple[Option, ...] = (
    *CORE_OPTIONS, *(option for part in PARTS for option in part.OPTIONS),
)


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
