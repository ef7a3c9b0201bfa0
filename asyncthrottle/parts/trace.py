"""A timeline of the last N steps (host spans, sampled device spans, steps in flight) as a Chrome
trace."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._options import Option, check_int
from ._build import Part

if TYPE_CHECKING:
    from ..core.events import Event
    from ..core.rule import Core
    from ._build import Build


# names of the host track's spans
HOST_SPANS = ("fetch", "body", "wait")
# name of the device track's spans
DEVICE_SPAN = "device"
# name of the counter
IN_FLIGHT = "in flight"
_PID, _HOST_TID, _DEVICE_TID = 1, 1, 2
_FETCH, _WAIT, _DRAIN = "fetch", "wait", "drain"
# (kind, start, seconds, step: its slot for a fetch, the awaited one for a wait)
_Span = tuple[str, float, float, int]
_DEVICE_PLACEMENT = "ends when the host saw the step complete (an upper bound on when it finished)"


def check_trace(trace: object) -> int:
    """Validate ``Throttle(trace=...)``: an int >= 0 (steps kept; 0 keeps none)."""
    checked = check_int("trace", trace, minimum=0, rule="an int >= 0 (how many recent steps the "
                                                        "timeline keeps)",
                        fix="e.g. trace=10_000, or trace=0 for no timeline", none=False)
    return int(checked or 0)


class Trace(Part):
    """Keeps the timeline of the last ``steps`` recorded steps; a part of the throttle.

    Per step, on the host track: ``fetch`` (taking the batch, or the time
    between ``end_step()`` and ``begin_step()``), ``wait`` (each time the host
    blocked on the device; ``args.waited_for`` names the step waited for,
    ``args.drain`` says whether ``drain()`` waited) and ``body`` (from the
    step's hand-out to its record: the loop body), each with ``args.step``;
    the counter ``in flight`` (steps unfinished on the device) at each
    hand-out. On the device track, the sampled steps' device time (from the
    timing events, read only once complete): the span *ends when the host saw
    the step complete* -- an upper bound on when the device finished it (tight
    when the host was waiting for that step, loose when the host was busy
    elsewhere) -- and lasts the step's measured device time.

    Memory is constant: one entry per step in a ring of ``steps`` entries,
    holding its few spans. The host's time between the last record and now
    (the last pass's final fetch, the drain's waits) is kept with the next
    step's entry and exported as well. A failed ``step()`` records
    nothing: its fetch and waits are kept with the step that replaces it, it
    has no ``body`` span. A wait inside a body (``Deferred.get()``,
    ``drain()``) is a ``wait`` span within the ``body`` span, counted once
    (as wait; ``args.waits_inside_s``). Over fully traced passes the spans add up to
    ``Stats.fetch_s``/``body_s``/``wait_s`` (the ``fetch`` spans of a ``step()`` loop: the time
    between its steps, ``Stats.between_s``), except what ``Stats.body_s``
    counts outside any step: the throttle's own bookkeeping between the spans
    (microseconds a step), a failed ``step()``'s body, and with ``step()`` or
    ``begin_step()`` the time from the last ``end_step()`` to ``drain()``.

    Threads: the hooks run on the loop's thread; :meth:`to_dict` and
    :meth:`export` take a snapshot and are safe from any thread.

    Args:
        core: the throttle's core (subscribe the trace to it).
        steps: how many recent steps to keep (>= 1).
        clock: the throttle's host clock, in seconds.
    """

    __slots__ = ("_clock", "_core", "_device", "_extra", "_fetch_s", "_fetch_start", "_h_in",
                 "_h_step", "_h_time", "_ring", "_sections", "capacity")

    PLACE = 100
    OPTIONS = (
        Option("trace", "int", 0, "keep a timeline of the last N steps",
               "[Timelines](timelines.md)", lambda name, value: check_trace(value),
               wrong_type=("8",), wrong_value=(-1,),
               help=("keep a timeline of the last ``trace`` steps for :meth:`export_trace` (0: "
                     "none).")),
    )

    @classmethod
    def build(cls, at: Build) -> Trace | None:
        """The timeline when ``trace`` > 0; it hears the device times of device timing and sections
        (when on) as they are read."""
        if not at.options["trace"]:
            return None
        return cls(at.core, at.options["trace"], at.clock)

    def __init__(self, core: Core, steps: int, clock: Callable[[], float]) -> None:
        if check_trace(steps) < 1:
            raise ValueError(f"a Trace keeps at least one step, got steps={steps!r}")
        self.capacity = steps
        self._core, self._clock = core, clock
        # One flat tuple of numbers per step (one allocation, soon untracked by the garbage
        # collector):
        # (step, record time, hand-out step, hand-out time, in flight, fetch start | None, fetch
        # seconds,
        # further spans | None). Most steps fetch once and wait at most once: the first fetch has
        # its
        # own fields, other spans (waits, further fetches) go to `further`.
        self._ring: deque[
            tuple[int, float, int, float, int, float | None, float, tuple[_Span, ...] | None]
        ]
        self._ring = deque(maxlen=steps)
        # the first fetch of the step not yet recorded
        self._fetch_start: float | None = None
        self._fetch_s = 0.0
        # its other spans
        self._extra: list[_Span] = []
        # the last hand-out: step, host time, in flight
        self._h_step, self._h_time, self._h_in = -1, 0.0, 0
        # (step, seen, busy, idle)
        self._device: deque[tuple[int, float, float, float]] = deque(maxlen=steps)
        self._sections: deque[tuple[int, float, tuple[tuple[str, float], ...]]] = deque(
            maxlen=steps
        )

    # -- hooks (the loop's thread; cheap: a few stores, one tuple per step) ---

    def on_fetch(self, step: int, start: float, seconds: float) -> None:
        if self._fetch_start is None:
            # before the start: a reader that sees the new start sees these seconds
            self._fetch_s = seconds
            self._fetch_start = start
        # a second fetch for one step: a pass ended and the next began before it was recorded
        else:
            self._extra.append((_FETCH, start, seconds, step))

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self._h_step, self._h_time, self._h_in = step, now, in_flight

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        extra = self._extra
        self._ring.append(
            (
                step, now, self._h_step, self._h_time, self._h_in, self._fetch_start, self._fetch_s,
                tuple(extra) if extra else None,
            )
        )
        self._fetch_start = None
        if extra:
            extra.clear()

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        self._extra.append((_WAIT if not self._core.draining else _DRAIN, start, seconds, step))

    def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
        """A sampled step's device time was read (its events are complete); placed at the host's
        now."""
        self._device.append((step, self._clock(), busy_s, idle_s))

    def on_sections(self, step: int, own_s: float, seconds: dict[str, float]) -> None:
        """A timed step's sections were read: device spans, one after the other, ending at the
        host's now."""
        self._sections.append((step, self._clock(), tuple(seconds.items())))

    # -- reading: any thread -------------------------------------------------

    def _snapshot(self) -> tuple[list[Any], list[_Span], list[Any]]:
        # a copy races only with the loop's thread moving on: try again
        for _ in range(100):
            try:
                ring = list(self._ring)
                start, seconds, extra = self._fetch_start, self._fetch_s, tuple(self._extra)
                # a record or fetch came in between
                if start is not self._fetch_start:
                    continue
                step = ring[-1][0] + 1 if ring else 0
                open_spans = ([(_FETCH, start, seconds, step)] if start is not None else []) + list(
                    extra
                )
                return ring, open_spans, list(self._device)
            # deque mutated during iteration
            except RuntimeError:
                continue
        raise RuntimeError("the trace changed during 100 attempts to copy it; export it from the "
                           "loop's thread")

    def to_dict(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The timeline in the Chrome Trace Event Format (timestamps in microseconds from its first
        event).

        ``otherData.asyncthrottle`` holds the traced steps, the sums of the
        host spans (``host_s``) and ``meta`` (the throttle's stats).
        """
        ring, open_spans, device = self._snapshot()
        first_step = ring[0][0] if ring else None
        device = [d for d in device if first_step is not None and d[0] >= first_step]
        # (name, track, start s, seconds, args)
        spans: list[tuple[str, int, float, float, dict[str, Any]]] = []
        counters: list[tuple[float, int]] = []
        totals = dict.fromkeys(HOST_SPANS, 0.0)

        def host(slot: int, entries: list[_Span]) -> None:
            for kind, start, seconds, step in entries:
                args: dict[str, Any] = {"step": slot}
                # a wait: "wait", or "drain" when drain() waited
                if kind != _FETCH:
                    args["waited_for"], args["drain"], kind = step, kind == _DRAIN, _WAIT
                totals[kind] += seconds
                spans.append((kind, _HOST_TID, start, seconds, args))

        for step, end, h_step, h_time, h_in, f_start, f_s, extra in ring:
            host(
                step,
                ([(_FETCH, f_start, f_s, step)] if f_start is not None else []) + list(extra or ()),
            )
            # mark()'s first step has no hand-out: an empty body
            begin, in_flight = end, 0
            if h_step == step:
                begin, in_flight = h_time, h_in
                counters.append((begin, in_flight))
            # A wait inside the body (Deferred.get(), drain()) is its own span, nested in the
            # body's: not body time.
            inner = sum(span[2] for span in extra or () if span[0] != _FETCH and span[1] >= begin)
            totals["body"] += end - begin - inner
            spans.append(("body", _HOST_TID, begin, end - begin,
                          {"step": step, "in_flight": in_flight, "waits_inside_s": inner}))
        host(ring[-1][0] + 1 if ring else 0, open_spans)
        for step, seen, busy, idle in device:
            spans.append((DEVICE_SPAN, _DEVICE_TID, seen - busy, busy,
                          {"step": step, "device_ms": busy * 1e3, "idle_before_ms": idle * 1e3}))
        for step, seen, named in list(self._sections):
            if first_step is None or step < first_step:
                continue
            start = seen - sum(seconds for _, seconds in named)
            for name, seconds in named:
                spans.append((name, _DEVICE_TID, start, seconds, {"step": step, "section": name,
                                                                  "device_ms": seconds * 1e3}))
                start += seconds
        origin = min([s[2] for s in spans] + [c[0] for c in counters], default=0.0)
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": "asyncthrottle"}},
            {
                "name": "thread_name", "ph": "M", "pid": _PID, "tid": _HOST_TID,
                "args": {"name": "host"},
            },
            {
                "name": "thread_name", "ph": "M", "pid": _PID, "tid": _DEVICE_TID,
                "args": {"name": "device (sampled steps)"},
            },
            {
                "name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": _HOST_TID,
                "args": {"sort_index": 0},
            },
            {
                "name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": _DEVICE_TID,
                "args": {"sort_index": 1},
            },
        ]
        events += [
            {"name": name, "cat": "asyncthrottle", "ph": "X", "pid": _PID, "tid": tid,
             "ts": round((start - origin) * 1e6, 3), "dur": round(seconds * 1e6, 3), "args": args}
            for name, tid, start, seconds, args in spans
        ]
        events += [
            {
                "name": IN_FLIGHT, "ph": "C", "pid": _PID, "ts": round((t - origin) * 1e6, 3),
                "args": {IN_FLIGHT: n},
            }
            for t, n in counters
        ]
        other: dict[str, Any] = {
            "capacity": self.capacity,
            "first_step": first_step,
            "last_step": ring[-1][0] if ring else None,
            "steps": len(ring),
            "clock_origin_s": origin,
            "host_s": totals,
            "device_span": _DEVICE_PLACEMENT,
        }
        if meta:
            other.update(meta)
        return {
            "traceEvents": events, "displayTimeUnit": "ms", "otherData": {"asyncthrottle": other},
        }

    def export(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
        """Write :meth:`to_dict` as JSON to ``path`` (atomically: a reader never sees half a
        file)."""
        doc = self.to_dict(meta)
        target = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(target))
        fd, tmp = _create(folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out, separators=(",", ":"))
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _create(folder: str) -> tuple[int, str]:
    """A new temporary file in ``folder``, open for writing, with the mode ``open()`` gives (the
    umask's, as the other files the program writes; ``mkstemp``'s is 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(folder, f".trace-{os.urandom(6).hex()}.json")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
