"""A frozen snapshot of what a throttle has seen."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Stats"]


@dataclasses.dataclass(frozen=True)
class Stats:
    """Counters of a throttle at one moment. Taking a snapshot never blocks or syncs.

    Attributes:
        steps: steps recorded (each step's event recorded once).
        completed: steps the throttle has seen complete on the device.
        in_flight: ``steps - completed`` when the snapshot was taken (no polling).
        max_in_flight: the most steps recorded and not yet seen complete, counted
            right after each record; never more than ``depth`` when blocking.
        waits: how many times the host blocked on the device.
        wait_s: total seconds the host spent blocked.
    """

    steps: int = 0
    completed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    waits: int = 0
    wait_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as a flat dict, ready for any logger."""
        return dataclasses.asdict(self)
