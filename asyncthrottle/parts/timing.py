"""Device timing samples: bounded memory, read only from completed events."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._options import Option, check_int
from ..core.events import Event, EventFactory
from ..core.notify import tell
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

_log = logging.getLogger("asyncthrottle")


class DeviceTimes:
    """Sums of every sample, and the most recent ``window`` samples for percentiles.

    Memory stays constant however many steps run.
    """

    __slots__ = ("_recent", "busy_s", "idle_s", "samples")

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
        """The device fields of :class:`~asyncthrottle.Stats`, totals extrapolated to ``completed``
        steps."""
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


class Sampling:
    """Which steps are sampled: every ``every``-th step, step 0 never (``every`` None: none).

    The one rule of ``sample_every=`` (device timing times these steps, sections
    time their phases; see :class:`DeviceTiming` for why step 0 is not).
    ``Build.sampling`` carries it to the parts.
    """

    __slots__ = ("every",)

    def __init__(self, every: int | None) -> None:
        self.every = every

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Sampling:
        """The throttle's rule, from its (checked) options."""
        return cls(options["sample_every"])

    @property
    def on(self) -> bool:
        """Any step is sampled."""
        return self.every is not None

    def sampled(self, step: int) -> bool:
        """``step`` is sampled."""
        every = self.every
        return every is not None and step > 0 and step % every == 0

    def per_sample(self) -> int:
        """Steps per sampled step (1 when none is: a rate per step)."""
        return self.every or 1


@dataclasses.dataclass(frozen=True)
class TimingStats:
    """The fields of :class:`~asyncthrottle.Stats` that device timing supplies."""

    device_samples: int = 0
    device_busy_s: float | None = None
    device_idle_s: float | None = None
    idle_fraction: float | None = None
    device_ms_mean: float | None = None
    device_ms_p50: float | None = None
    device_ms_p90: float | None = None


class DeviceTiming(Part):
    """Times every ``every``-th step on the device; a part of the throttle, read only from completed
    events.

    Step ``n`` is sampled when ``n % every == 0``, except step 0: the
    throttle's first step carries one-time host work (JAX's compilation,
    cuDNN's autotuning, lazy initialisation) while the device idles, and one
    such sample would be the mean's and the totals' whole figure (a JAX loop
    read 4.58 ms/step against a p50 of 0.08). Its device time needs a
    timing event at the end of step ``n - 1`` and of step ``n``, and -- when
    nothing was queued at its hand-out -- a start marker recorded then. A
    sampled step's own event is the timing event (the core asks this part for
    the events of those steps only: unsampled steps cost one comparison).
    Where the backend's events are its timing events (``timed`` is the
    core's ``new_event``: JAX, a custom ``events=``), step ``n - 1``'s own
    event, the newest in flight when ``n`` is recorded (or the one its idle
    hand-out retired), is the start: the core asks this part at the sampled
    steps alone, one call a sample instead of two.
    Samples are read one cycle later, at the next sampled step, and when a
    pass ends or the throttle drains (:meth:`flush`); while any part listens
    (``Subscriber.on_sample``, asked of the core at each sampled step), as
    soon as their steps retire, and each is told. The first failing
    ``elapsed_time`` (events without timing, such as a plain
    ``torch.cuda.Event()``) turns timing off for good; the loop goes on.

    Args:
        core: the throttle's core.
        timed: factory of events with ``elapsed_time``.
        sampling: the steps it times (``sample_every``; on).
        trusted: the events are known to have ``elapsed_time`` (a built-in
            backend); otherwise no start marker is made before the first
            timed event has shown it (every event a custom factory makes is
            recorded), so a first sampled step handed out idle is not timed.
    """

    PLACE = 10
    OPTIONS = (
        Option("sample_every", "int | None", 8, "time every k-th step on the device (`None`: off)",
               "[Telemetry](telemetry.md)",
               functools.partial(check_int, minimum=1,
                                 rule="an int >= 1 (time every k-th step) or None",
                                 fix="e.g. sample_every=8, or None for no device timing"),
               wrong_type=("8",), wrong_value=(0,),
               help=('time every k-th step on the device, step 0 (compilation, autotuning) '
                     'excepted (None: no device timing, no sections).')),
    )
    STATS = TimingStats

    @classmethod
    def build(cls, at: Build) -> DeviceTiming | None:
        timed = at.backend.timed
        if not at.sampling.on or timed is None:
            return None
        return cls(at.core, timed, at.sampling, trusted=at.backend.trusted)

    def fields(self) -> dict[str, Any]:
        return self.times.fields(self.core.completed)

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if stats.device_ms_mean is None:
            return ["  device: not timed (synchronous backend, events without elapsed_time, or no "
                    "samples yet)"]
        return [
            f"  device: {stats.device_ms_mean:.2f} ms/step (p50 {stats.device_ms_p50:.2f}, p90 "
            f"{stats.device_ms_p90:.2f}; {stats.device_samples} steps timed), idle >= "
            f"{stats.idle_fraction:.0%}"
        ]

    @staticmethod
    def postfix(stats: Stats) -> list[str]:
        return [] if stats.idle_fraction is None else [f"idle={stats.idle_fraction:.0%}"]

    def __init__(self, core: Core, timed: EventFactory, sampling: Sampling, *,
                 trusted: bool = False) -> None:
        self.core, self.timed, self.sampling, self.trusted = core, timed, sampling, trusted
        every = self.every = sampling.per_sample()
        self.times = DeviceTimes()
        # (sampled step, end of the step before, its end, start marker recorded at its hand-out)
        self.ends: deque[tuple[int, Any, Any, Any]] = deque()
        # the start marker of step _start_step, recorded at its hand-out (-2: none)
        self._start_step = -2
        self._start: Any = None
        self.enabled = True
        # samples are read as their steps retire (a part listens: core.on_sample)
        self._eager = False
        # the timing event of step _before_step: the next sampled step's start (-2: none)
        self._before_step = -2
        self._before: Any = None
        # the markers have record_idle (JAX's: see asyncthrottle.jax); known at the first one
        self._record_idle: bool | None = None
        # the steps' own events can be timed: a sample's start is the event of the step before it
        self._shared = timed is core.new_event
        # the first step after the last pause (shared events: the steps before it start no sample)
        self._resumed = 0
        # the first step supplied: the first sampled one (every, never 0), or the step before it
        self._first = every if self._shared else every - 1
        core.supply_from(self, self._first)

    def supply_event(self, step: int) -> Event:
        """The event of a step whose end is timed: a timing event (the core asks only at those
        steps).

        It may turn timing off (a failed read in :meth:`flush`): the core then
        ignores the scheduling below, and every later step gets a plain event.
        """
        event = self.timed()
        if not (self.trusted or self._trust(event)):
            return event
        every, core = self.every, self.core
        if self._shared:
            # the step before's event: the newest in flight (this one is not queued yet), or the
            # one retired at this step's idle hand-out; none across a pause
            pending = core.pending
            if step <= self._resumed:
                before = None
            elif pending:
                before = pending[-1]
            else:
                before = self._before if self._before_step == step - 1 else None
            self._before_step, self._before = -2, None
        elif not self.sampling.sampled(step):
            # the step before a sampled one (step 0 at every=1): its end is the sampled step's start
            core.supply_next(self, step + 1)
            self._before_step, self._before = step, event
            return event
        else:
            before = self._before if self._before_step == step - 1 else None
        ends = self.ends
        if ends:
            # the last cycle's sample, once complete
            self.flush()
        ends.append((step, before, event, self._start if self._start_step == step else None))
        if bool(core.on_sample) is not self._eager:
            self._hear_retirements(not self._eager)
        # (a held event is never re-recorded: hold none longer than needed)
        self._start_step, self._start = -2, None
        if self._shared:
            self.core.supply_next(self, step + every)
        # every step is sampled: each end is also the next step's start
        elif every == 1:
            self.core.supply_next(self, step + 1)
            self._before_step, self._before = step, event
        else:
            self.core.supply_next(self, step + every - 1)
        return event

    def on_drop(self, step: int) -> None:
        """``step`` ended without an event (its record failed, or its body raised): forget its
        timing event."""
        ends = self.ends
        if ends and ends[-1][0] == step:
            ends.pop()
        if self._before_step == step:
            self._before_step, self._before = -2, None
        if self._start_step == step:
            # marked at the hand-out of the failed attempt: the next attempt is marked anew
            self._start_step, self._start = -2, None
        sampled = self.sampling.sampled
        if self.core.supplied_step > step >= self._first and (
            sampled(step) or (not self._shared and sampled(step + 1))
        ):
            # the step that takes its number is timed instead
            self.core.supply_next(self, step)

    def on_pause(self, now: float) -> None:
        """The loop left its pass: the next sample's start is not the end of the step before the
        pause.

        Without this, the first sampled step after an evaluation between epochs
        would count the whole pause as device idle (or as busy time).
        """
        self._before_step, self._before = -2, None
        self._resumed = self.core.steps

    def supplied_idle(self, step: int, before: Event | None) -> None:
        """A timed step is handed out with nothing queued: if it is sampled, mark its start (the
        device is idle); with shared events, keep the step before's (``before``), the idle's
        start."""
        # (step 0 is never sampled: at every=1 it is supplied as the step before step 1)
        # (shared events: the core asks at the sampled steps alone; no call a sample for the rule)
        if self._shared or self.sampling.sampled(step):
            # The first sampled step may be handed out idle before its record showed whether the
            # events can be timed: with shared events the step before's tells (separate ones were
            # asked at the step before's record).
            if not self.trusted and (before is None or not self._shared or not self._trust(before)):
                return
            if self._shared and before is not None:
                self._before_step, self._before = step - 1, before
            marker = self.timed()
            record_idle = self._record_idle
            if record_idle is None:
                record_idle = self._record_idle = hasattr(marker, "record_idle")
            # record_idle: see asyncthrottle.jax
            if record_idle:
                marker.record_idle()  # type: ignore[attr-defined]
            else:
                marker.record()
            self._start_step, self._start = step, marker

    def _trust(self, event: Any) -> bool:
        """Whether the backend's events can be timed, learnt from the first one made; if not,
        timing turns off, quietly."""
        if not hasattr(event, "elapsed_time"):
            self.disable(None)
            return False
        self.trusted = True
        return True

    def _hear_retirements(self, eager: bool) -> None:
        """Read each sample as its step retires (``eager``: a part listens for samples, such as the
        trace, which places them when the host first sees the step complete), or lazily."""
        self._eager = eager
        if eager:
            self.core.listen("on_retire", self._on_retire)
        else:
            self.core.unlisten("on_retire", self._on_retire)

    def _on_retire(self, step: int) -> None:
        """Only while a part listens for samples (see :meth:`_hear_retirements`)."""
        ends = self.ends
        if ends and ends[0][0] <= step:
            self.flush()

    def disable(self, reason: str | None) -> None:
        """Turn device timing off for good (the events cannot be timed); ``reason`` is logged."""
        if self.enabled and reason is not None:
            _log.warning("asyncthrottle: device timing is off: %s", reason)
        self.enabled = False
        core = self.core
        # also stops its supply of events; safe while the core asks this part
        core.unsubscribe(self)
        core.unlisten("on_retire", self._on_retire)
        self.ends.clear()
        self._start_step, self._start = -2, None

    def close(self) -> None:
        """Let go of the timing events of the samples not read (never read now)."""
        self.ends.clear()
        self._start_step, self._start = -2, None
        self._before_step, self._before = -2, None

    def flush(self) -> None:
        """Read the timing of every sampled step seen complete so far. Queries only; never blocks.

        Called on the loop's thread: at each sampled step (for the cycle before) and when a
        pass ends or the throttle drains, so ``stats`` after a loop has every sample.
        """
        core = self.core
        ends, completed = self.ends, core.completed
        while ends and ends[0][0] < completed:
            # the sampled step retired, so its end is complete; its start is the marker of its
            # hand-out or the end of the step before
            step, before, end, start = ends.popleft()
            first = start if start is not None else before
            try:
                # queries only: never read an unfinished event (a retirement after a wait on a
                # later step asked none of the events before it; a JAX event is dated when asked)
                if first is None or not first.query():
                    continue
                busy = first.elapsed_time(end) / 1000.0
                idle = 0.0
                if start is not None and before is not None and before.query():
                    idle = before.elapsed_time(start) / 1000.0
            except Exception as exc:
                self.disable(f"elapsed_time() failed on the backend's events ({exc})")
                return
            # (timing events can read a hair below zero)
            if busy < 0.0:
                busy = 0.0
            if idle < 0.0:
                idle = 0.0
            # DeviceTimes.add, inlined: once a sample
            times = self.times
            times.samples += 1
            times.busy_s += busy
            times.idle_s += idle
            times._recent.append(busy * 1000.0)
            if core.on_sample:
                # (a part that raises hides the sample from no other; the error is raised after)
                tell(core.on_sample, step, busy, idle)
