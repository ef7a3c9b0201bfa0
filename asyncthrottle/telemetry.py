"""Device timing samples: bounded memory, read only from completed events."""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["DeviceTimes", "TimedSteps"]


class DeviceTimes:
    """Sums of every sample, and the most recent ``window`` samples for percentiles.

    Memory stays constant however many steps run.
    """

    def __init__(self, window: int = 1024) -> None:
        self.samples = 0
        self.busy_s = 0.0
        self.idle_s = 0.0
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, busy_s: float, idle_s: float) -> None:
        self.samples += 1
        self.busy_s += busy_s
        self.idle_s += idle_s
        self._recent.append(busy_s * 1000.0)

    def fields(self, completed: int) -> dict[str, Any]:
        """The device fields of :class:`~asyncthrottle.Stats`, totals extrapolated to ``completed`` steps."""
        if not self.samples:
            return {}
        scale = max(completed, self.samples) / self.samples
        recent = sorted(self._recent)
        total = self.busy_s + self.idle_s
        return {
            "device_samples": self.samples,
            "device_busy_s": self.busy_s * scale,
            "device_idle_s": self.idle_s * scale,
            "idle_fraction": self.idle_s / total if total > 0 else 0.0,
            "device_ms_mean": sum(recent) / len(recent),
            "device_ms_p50": _quantile(recent, 0.5),
            "device_ms_p90": _quantile(recent, 0.9),
        }


def _quantile(ordered: list[float], q: float) -> float:
    index = q * (len(ordered) - 1)
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


class TimedSteps:
    """Which steps get timing events, and the timing read when they complete.

    Step ``n`` is sampled when ``n % every == 0``. Its device time needs a
    timing event at the end of step ``n - 1`` and of step ``n``, and -- when
    nothing was queued at its hand-out -- a start marker recorded then.
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.times = DeviceTimes()
        self.ends: dict[int, Any] = {}  # step -> timing event at its end, until it completes
        self.starts: dict[int, Any] = {}  # step -> start marker recorded at its hand-out
        self._previous: tuple[int, Any] | None = None

    def wants_end(self, step: int) -> bool:
        return step % self.every == 0 or (step + 1) % self.every == 0

    def wants_start(self, step: int) -> bool:
        return step % self.every == 0

    def complete(self, step: int) -> None:
        """Step ``step`` (and every step before it) is complete: read its timing. Never blocks."""
        end = self.ends.pop(step, None)
        start = self.starts.pop(step, None)
        if end is None:
            return
        previous = self._previous[1] if self._previous is not None and self._previous[0] == step - 1 else None
        first = start if start is not None else previous
        if step % self.every == 0 and first is not None and _complete(first, end, previous):
            busy = first.elapsed_time(end) / 1000.0
            idle = previous.elapsed_time(start) / 1000.0 if start is not None and previous is not None else 0.0
            self.times.add(max(busy, 0.0), max(idle, 0.0))
        self._previous = (step, end)


def _complete(*events: Any) -> bool:
    """Every event reports completion (queries only; timing is never read from unfinished events)."""
    return all(event is None or event.query() for event in events)
