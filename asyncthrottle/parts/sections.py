"""Sections: the device time of named phases of a step (forward, backward, a collective), never a
sync."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._options import check_bool
from ..core.errors import closed
from ..core.events import Event, EventFactory
from ..core.notify import tell
from ._build import Part
from .timing import Sampling

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

# recent samples kept per section name (medians)
_WINDOW = 64
# The open entry of a section in a step that is not sampled: (no start, outermost and not
# collective).
_UNTIMED_OWN: tuple[Any, bool] = (None, True)
_UNTIMED: tuple[Any, bool] = (None, False)
# why a section reads NaN (the summary's words)
_UNSEEN = ("the backend dates a marker when the host sees it complete (JAX), and the host saw "
           "its start and end complete together: it was not waiting on the step while the "
           "section ran (a host-bound or starved loop, or a wait that sleeps through it such as "
           "wait='hybrid'; see docs/telemetry.md)")


def _median(values: deque[float]) -> float:
    """The median of the timed samples (NaN: not timed); NaN when none was."""
    ordered = sorted(value for value in values if value == value)
    return ordered[len(ordered) // 2] if ordered else math.nan


def _seconds(start: Any, end: Any) -> float:
    """Seconds between two completed events; NaN where the backend did not see them complete apart
    (``end.resolves(start)``: events dated by the host, JAX's)."""
    resolves = getattr(end, "resolves", None)
    if resolves is not None and not resolves(start):
        return math.nan
    seconds: float = start.elapsed_time(end) / 1000.0
    # (timing events can read a hair below zero)
    return seconds if seconds > 0.0 else 0.0


@dataclasses.dataclass(frozen=True)
class SectionStats:
    """The fields of :class:`~asyncthrottle.Stats` that sections supply."""

    sections: dict[str, float] | None = dataclasses.field(
        default=None,
        metadata={"flat": lambda s: {f"section_ms_{name}": ms for name, ms in (s or {}).items()}},
    )


class Section:
    """``with throttle.section(name):`` -- one phase of the current step; see :meth:`Sections.open`.

    Reusable: the same object may be entered again once it was left.
    ``__enter__``/``__exit__`` may be called directly (framework hooks that
    cannot hold a ``with`` block).
    """

    __slots__ = ("_collective", "_core", "_name", "_owner")

    def __init__(self, owner: Sections, name: str, collective: bool) -> None:
        self._owner, self._core, self._name, self._collective = owner, owner.core, name, collective

    def __enter__(self) -> Section:
        # (a section is entered every step: docs/architecture.md's hot paths)
        owner = self._owner
        name = self._name
        # the step being run, if any
        step = self._core.steps
        # the step's first section (a record resets owner.step): is a step open?
        if step != owner.step:
            if not owner.in_step():
                owner.refuse(name)
            owner.begin(step)
        open_ = owner.open_
        if name in open_:
            owner.nested(name, step)
        own = not open_ and not self._collective
        if not owner.timing:
            open_[name] = _UNTIMED_OWN if own else _UNTIMED
        elif owner.timed is None:
            open_[name] = (owner.clock(), own)
        else:
            start = owner.timed()
            owner.mark(start)
            open_[name] = (start, own)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        owner = self._owner
        entry = owner.open_.pop(self._name, None)
        if entry is _UNTIMED_OWN or entry is _UNTIMED:
            return
        if entry is None:
            raise RuntimeError(f"section({self._name!r}) was left but is not open in this step; "
                               "enter it first (in the same step)")
        if owner.timed is None:
            owner.marks.append((self._name, entry[0], owner.clock(), entry[1]))
        else:
            end = owner.timed()
            owner.mark(end)
            owner.marks.append((self._name, entry[0], end, entry[1]))


class Sections(Part):
    """A part of the throttle: named sections of a step, timed on the device without a sync.

    On an asynchronous device a sampled step's section records a timing
    event when it is entered and one when it is left (events of the
    backend's timing factory, reused once nobody holds them, like the step
    events); the pair is read once the step retires -- queries only, never a
    wait. On a synchronous backend (the CPU) the host clock times every step's
    sections: there the host's time is the device's. Sampling follows
    ``sample_every`` (the steps device timing samples); with
    ``sample_every=None`` no backend times sections, the CPU included. Step 0
    is never timed: its one-time work (a compilation, autotuning) is no
    phase's. Where events are dated by the host (JAX), a section reads NaN
    unless the host saw its markers complete apart (see
    :meth:`~asyncthrottle.jax.JaxEvent.watch`).

    A section used several times in one step (micro-batches) counts the sum.
    ``collective=True`` marks a section that holds a collective (DDP's
    backward with its all-reduce): its time includes waiting for the slowest
    rank, so rank scores leave it out of the rank's own work. Parts that
    listen (``Subscriber.on_sections``) hear, per timed step, its sections
    and the sum of its outermost sections that are not collective.

    Errors (``RuntimeError``): a section entered outside a step (before the
    step is handed out, or after it was recorded), a section entered again
    while it is open, and a section still open when its step is recorded
    (raised by the record: the step still counts; the section is forgotten).
    """

    PLACE = 20
    STATS = SectionStats

    @classmethod
    def build(cls, at: Build) -> Sections:
        core = at.core
        timed = None if core.synchronous else at.backend.timed
        return cls(core, timed, at.sampling, at.clock)

    def __init__(self, core: Core, timed: EventFactory | None, sampling: Sampling,
                 clock: Callable[[], float]) -> None:
        self.core, self.timed, self.clock = core, timed, clock
        self.synchronous = core.synchronous
        # the host clock times every step on the CPU; sample_every=None times none anywhere
        self.sampling = sampling if not (sampling.on and self.synchronous) else Sampling(1)
        # the step whose sections are open or were timed, or -1
        self.step = -1
        # that step's sections are timed
        self.timing = False
        # hooks are added at the first section: a loop without sections pays nothing
        self.listening = False
        # the throttle's: a step is open now
        self.in_step: Callable[[], bool] = lambda: False
        # name -> (start, outermost and not collective)
        self.open_: dict[str, tuple[Any, bool]] = {}
        # this step's sections: (name, start, end, own work)
        self.marks: list[tuple[str, Any, Any, bool]] = []
        # this step's timing events, in the order they were recorded (for the step's watch())
        self.recorded: list[Any] = []
        # recorded, not yet read
        self.waiting: deque[tuple[int, list[tuple[str, Any, Any, bool]]]] = deque()
        # name -> recent device ms
        self.recent: dict[str, deque[float]] = {}
        self.made: dict[tuple[str, bool], Section] = {}
        # the throttle was closed: no section is made or entered
        self.closed = False

    def section(self, name: str, collective: bool) -> Section:
        """The context manager of ``name`` (made once per name and kind, then reused: a made one is
        found first, before any check: ``Throttle.section()`` is called in every step).

        Raises:
            TypeError: ``name`` is not a str, or ``collective`` not True or False.
            ValueError: ``name`` is empty.
            RuntimeError: the throttle is closed.
        """
        # (identity, not equality: collective=1 is not taken for True)
        if type(name) is str and (collective is False or collective is True):
            made = self.made.get((name, collective))
            if made is not None:
                return made
        check_bool("collective", collective)
        if not isinstance(name, str):
            raise TypeError(f"section name must be a non-empty str, got {name!r} "
                            f"({type(name).__name__}); e.g. section('forward')")
        if not name:
            raise ValueError("section name must be a non-empty str, got ''; name the phase, e.g. "
                             "section('forward')")
        if self.closed:
            raise RuntimeError(closed("section()"))
        key = (name, collective)
        made = self.made.get(key)
        if made is None:
            made = self.made[key] = Section(self, name, collective)
        return made

    def close(self) -> None:
        """Let go of the timing events not read and of the sections made (they hold this part); a
        section entered after raises."""
        self.closed = True
        self.made.clear()
        self.waiting.clear()
        self.recorded, self.marks = [], []
        self.open_.clear()

    # -- the sections ----------------------------------------------------------

    def refuse(self, name: str) -> None:
        if self.closed:
            raise RuntimeError(closed(f"section({name!r})"))
        raise RuntimeError(
            f"section({name!r}) was entered outside a step: a section brackets part of a step, so "
            "enter it inside the loop body (a wrapped loop's body, `with throttle.step():` or "
            "between begin_step() and end_step())")

    def mark(self, event: Any) -> None:
        """Record a section's timing event: with its ``mark()`` where it has one (JAX: only the
        step's own event takes what ``barrier_on()`` queued), else ``record()``."""
        self.recorded.append(event)
        mark = getattr(event, "mark", None)
        if mark is not None:
            mark()
        else:
            event.record()

    def nested(self, name: str, step: int) -> None:
        raise RuntimeError(f"section({name!r}) was entered while already open in step {step}; "
                           "sections of one name do not nest: leave it first, or give the inner "
                           "one another name")

    def begin(self, step: int) -> None:
        """The first section of ``step``: is it timed? (and, at the very first, listen to the
        records)."""
        if not self.listening:
            self.listening = True
            core = self.core
            core.listen("on_record", self._on_record)
            core.listen("on_drop", self._on_drop)
        self.step = step
        # (never step 0: its one-time work, a compilation, is no phase's time; as device timing)
        self.timing = self.sampling.sampled(step)

    # -- the core's notifications, heard while needed (not subscribed) ---------

    def _on_record(self, step: int, event: Event | None, now: float) -> None:
        self.step = -1
        marks = self.marks
        if marks:
            self.marks = []
            if self.synchronous:
                self._add(step, [(name, end - start, own) for name, start, end, own in marks])
            else:
                recorded, self.recorded = self.recorded, []
                # events dated only when seen complete (JAX): by the waits on the step's event,
                # after the step before's (the device reaches the first section after it)
                watch = getattr(event, "watch", None)
                if watch is not None:
                    pending = self.core.pending
                    watch([pending[-2], *recorded] if len(pending) > 1 else recorded)
                # retirements are heard only while a timed step waits to be read
                if not self.waiting:
                    self.core.listen("on_retire", self._on_retire)
                self.waiting.append((step, marks))
        if self.open_:
            self.recorded = []
            left = list(self.open_)
            self.open_.clear()
            raise RuntimeError(f"section(s) {', '.join(map(repr, left))} still open when step "
                               f"{step} was recorded: leave every section before the step ends (a "
                               "`with` block does); the step counts, the open sections are not "
                               "timed")

    def _on_drop(self, step: int) -> None:
        self.step = -1
        self.marks = []
        self.recorded = []
        self.open_.clear()

    def _on_retire(self, step: int) -> None:
        waiting = self.waiting
        while waiting and waiting[0][0] <= step:
            done, marks = waiting[0]
            try:
                # queries only: never read an unfinished event (the step's own event is complete)
                timed = [(name, _seconds(start, end), own) for name, start, end, own in marks
                         if start.query() and end.query()]
            except Exception:
                # events without timing: sections are not timed
                self.sampling = Sampling(None)
                waiting.clear()
                self.core.unlisten("on_retire", self._on_retire)
                return
            waiting.popleft()
            if not waiting:
                self.core.unlisten("on_retire", self._on_retire)
            self._add(done, timed)

    def _add(self, step: int, timed: list[tuple[str, float, bool]]) -> None:
        per_name: dict[str, float] = {}
        own_s = 0.0
        for name, seconds, own in timed:
            per_name[name] = per_name[name] + seconds if name in per_name else seconds
            if own:
                own_s += seconds
        recent = self.recent
        for name, seconds in per_name.items():
            kept = recent.get(name)
            if kept is None:
                kept = recent[name] = deque(maxlen=_WINDOW)
            kept.append(seconds * 1000.0)
        hooks = self.core.on_sections
        if hooks:
            # they hear the timed sections; own work is NaN if one of its sections is
            tell(hooks, step, own_s,
                 {name: seconds for name, seconds in per_name.items() if seconds == seconds})

    # -- results ---------------------------------------------------------------

    def fields(self) -> dict[str, Any]:
        # a copy: another thread may read stats
        recent = dict(self.recent)
        if not recent:
            return {}
        return {"sections": {name: _median(kept) for name, kept in recent.items() if kept}}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        sections = stats.sections
        if not sections:
            return []
        total = sum(ms for ms in sections.values() if ms == ms)
        return [
            f"  section {name}: {ms:.2f} ms/step (median)"
            + (f", {ms / total:.0%} of the sections" if total else "")
            if ms == ms else f"  section {name}: not timed (NaN): {_UNSEEN}"
            for name, ms in sections.items()
        ]
