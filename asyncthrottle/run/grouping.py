"""The report's steps: the live steps (the runner's candidate boundaries, which ``--depth``'s
throttle and the NaN watch need as they happen) grouped by the record's classifier
(:mod:`~asyncthrottle.run.classify`).

The live finder may cut one step of the script in several (SAM's two passes, a WGAN's
generator update, three models on one batch): each live step's ``ended`` event in the record
says which updates it holds, and consecutive live steps whose updates are of one classifier step
are one report step. A live step is never split: one that holds the updates of several
classifier steps makes them one report step.

A record that is not written (no ``--events``) is grouped as it grows (:class:`Grouper`): its
decided part (where no rule's answer can change with more events) becomes a byte a live step,
and its events are dropped, so that a long run holds a window of a few steps."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from .classify import Before, Step, window
from .record import ANSWERS, Record

__all__ = ["Grouper", "groups", "starts"]

Event = tuple[Any, ...]

# a window of this many events is grouped and dropped up to its decided part (then twice its
# size left, if more)
WINDOW = 2048


def groups(events: Sequence[Event]) -> list[int]:
    """For each live step the record ended (``ended`` events, numbered 0, 1, ...), the report
    step it is part of: ``[0, 0, 1, 2, 2]`` makes five live steps three. ``[]`` where the record
    tells nothing to group by (no live step ended in it, none of the classifier's steps, or
    live steps not numbered from 0 in order: the live steps are the report's)."""
    ends = _ends(events, 0)
    if ends is None:
        return []
    steps, _ = window(events)
    found = _grouped(events, [step for step in steps if _trained(step)], ends)
    return found if any(_trained(step) for step in steps) else []


def starts(events: Sequence[Event]) -> bytes:
    """:func:`groups` as a byte a live step: 1 where it begins a report step (``b""``: each
    live step is one)."""
    return _starts(groups(events))


class Grouper:
    """The report steps of a record's live steps, found as it grows: :meth:`grow` after each
    live step's end keeps ``starts`` (a byte a live step: 1 where it begins a report step) and
    drops the record's decided part: at once in the usual loop (:meth:`_one`), else once the
    record holds :data:`WINDOW` events; :meth:`starts_all` adds the rest's at the script's
    end. A record whose live steps are not numbered 0, 1, ... is not grouped (each live step is
    one report step), and its events are dropped."""

    def __init__(self, record: Record, size: int = WINDOW) -> None:
        self.record = record
        self.starts = bytearray()
        self._before = Before()
        self._size = self._next = size
        # the live steps ended but not grouped yet: each one's _Live (absolute indices)
        self._pending: list[_Live] = []
        self._off = False

    def grow(self) -> None:
        """After a live step's end (the record's last event)."""
        record = self.record
        events = record.events
        if self._off or not events or events[-1][0] != "ended":
            # (not grouped, or the record is full: starts_all() groups what it holds)
            if self._off:
                record.forget(len(events))
            return
        if events[-1][2] != len(self.starts) + len(self._pending):
            self._off = True
            record.forget(len(events))
            return
        pending = self._pending
        offset = record.offset
        start = pending[-1].stop if pending else offset
        # (_cut, inlined where the live step ended at the event before: the usual loop)
        last = len(events) - 2
        stop = last if last >= 0 and events[last][0] not in _PASSED else _cut(events, last + 1)
        pending.append(_scan(events, start - offset, stop, offset))
        if len(pending) == 2 and self._one():
            return
        if len(events) >= self._next:
            self._drop(events)
            self._next = max(self._size, 2 * len(record.events))

    def _one(self) -> bool:
        """The first of the two live steps not grouped yet (which began a step for good) holds
        one update, and the second's first update begins the next step for good (a batch taken
        between them, or the same optimizer again, or each ``backward()`` where no optimizer was
        made): the first is one report step, and its events are dropped. False: not so."""
        first, second = self._pending
        before = self._before
        made = before.made or first.made or second.made
        held, begins = (first.step, second.first_step) if made else (
            first.backward, second.first_backward)
        if held is None or begins is None:
            return False
        (key, end), (begin, following) = held, begins
        if following != key and first.fetched <= end and second.fetch >= begin:
            return False
        self.starts.append(1)
        if first.keys:
            before.keys.update(first.keys)
        before.made = made
        before.alone.add(key)
        self.record.forget(first.stop - self.record.offset)
        del self._pending[0]
        return True

    def starts_all(self) -> bytearray:
        """Every live step's byte (1: it begins a report step), the record's last part
        grouped; a live step it lacks (past the record's limit) is one of its own."""
        events = self.record.events
        ends = _ends(events, len(self.starts))
        starts = bytearray(self.starts)
        if ends is None:
            # (each live step its own: Source.regroup's for those past the bytes)
            return starts
        steps, _ = window(events, before=self._before)
        return starts + _starts(_grouped(events, [s for s in steps if _trained(s)], ends))

    def _drop(self, events: list[Event]) -> None:
        ends = _ends(events, len(self.starts))
        if not ends:
            return
        steps, firm = window(events, before=self._before)
        cut = _decided(steps, firm, ends)
        if cut is None:
            return
        count, at = cut
        done = steps[:count]
        self.starts += _starts(_grouped(events, [s for s in done if _trained(s)],
                                        [end for end in ends if end <= at]))
        self._before.take(events[:at], done)
        # (the ended events of the live steps grouped that are left are passed over: _ends)
        self.record.forget(at)
        events = self.record.events
        offset = self.record.offset
        self._pending = []
        for stop in _ends(events, len(self.starts)) or []:
            start = self._pending[-1].stop if self._pending else offset
            self._pending.append(_scan(events, start - offset, stop, offset))


class _Live(NamedTuple):
    """What the usual loop's grouping reads of a live step (absolute indices of the record's
    events): where it ended; its one outermost optimizer step (key, end) and its one
    ``backward()`` (None, index), each None where it held none or more (or one raised); its
    first optimizer step (begin, key) and ``backward()`` (index, None); its first and last
    batch taken; whether it made or stepped an optimizer, and the keys of those it made."""

    stop: int
    step: tuple[int | None, int] | None
    backward: tuple[int | None, int] | None
    first_step: tuple[int, int | None] | None
    first_backward: tuple[int, int | None] | None
    fetch: int
    fetched: int
    made: bool
    keys: tuple[int, ...]


# a live step's kinds of events, and where its events of each kind are (see _plan), or None
# where it is no usual one (the general _scan_all reads it)
_Plan = tuple[int, int, int, int, int, int] | None
_PLANS: dict[tuple[str, ...], _Plan] = {}
# the kinds of events planned at most (a script's live steps repeat a few shapes)
_PLANNED = 256
_KIND = itemgetter(0)
_NO_FETCH = 1 << 62
_new = tuple.__new__


def _scan(events: Sequence[Event], start: int, stop: int, offset: int) -> _Live:
    """The :class:`_Live` of ``events[start:stop]`` (the record's window, whose first event's
    absolute index is ``offset``): a usual live step's by the plan of its kinds of events,
    read once for each shape (no loop over its events in Python), else by :func:`_scan_all`."""
    kinds = tuple(map(_KIND, events[start:stop]))
    try:
        plan = _PLANS[kinds]
    except KeyError:
        if len(_PLANS) >= _PLANNED:
            _PLANS.clear()
        plan = _PLANS[kinds] = _plan(kinds)
    if plan is None:
        return _scan_all(events, start, stop, offset)
    step_at, end_at, backwards, first_backward, fetch, fetched = plan
    base = start + offset
    step = first_step = None
    if step_at >= 0:
        begin = events[start + step_at]
        first_step = (base + step_at, begin[2])
        if end_at > step_at and events[start + end_at][2] == begin[3]:
            step = (begin[2], base + end_at)
    return _new(_Live, (stop + offset, step, (None, base + backwards) if backwards >= 0 else None,
                        first_step, (base + first_backward, None) if first_backward >= 0 else None,
                        base + fetch if fetch >= 0 else _NO_FETCH,
                        base + fetched if fetched >= 0 else -1, step_at >= 0, ()))


def _plan(kinds: tuple[str, ...]) -> _Plan:
    """Where a live step of ``kinds`` has its optimizer step and its end, its one
    ``backward()`` (if one only) and its first, its first and last batch taken (-1: none), for
    a usual live step: no optimizer made, no optimizer step's frames dropped, one optimizer step
    at most and its end at most. None: not one."""
    if "made" in kinds or "dropped" in kinds or kinds.count("step") > 1 or \
            kinds.count("step_end") > 1:
        return None
    found = [kinds.index(kind) if kind in kinds else -1 for kind in ("step", "step_end")]
    backwards = [k for k, kind in enumerate(kinds) if kind == "backward"]
    fetches = [k for k, kind in enumerate(kinds) if kind == "fetch"]
    return (found[0], found[1], backwards[0] if len(backwards) == 1 else -1,
            backwards[0] if backwards else -1, fetches[0] if fetches else -1,
            fetches[-1] if fetches else -1)


def _scan_all(events: Sequence[Event], start: int, stop: int, offset: int) -> _Live:
    """:func:`_scan`, an event at a time: any live step's."""
    step: tuple[int | None, int] | None = None
    first_step: tuple[int, int | None] | None = None
    first_backward: tuple[int, int | None] | None = None
    running: list[int] = []
    many = made = False
    backwards = 0
    fetch, fetched = 1 << 62, -1
    keys: list[int] = []
    last = -1
    for index in range(start, stop):
        event = events[index]
        kind = event[0]
        if kind == "step":
            made = True
            if not running:
                many = many or step is not None
                step = (event[2], -1)
                if first_step is None:
                    first_step = (index + offset, event[2])
            running.append(event[3])
        elif kind == "step_end":
            if running and running[-1] == event[2]:
                running.pop()
                if not running and step is not None:
                    step = (step[0], index + offset)
            else:
                many = True
        elif kind == "backward":
            backwards += 1
            last = index + offset
            if first_backward is None:
                first_backward = (last, None)
        elif kind == "fetch":
            fetch = min(fetch, index + offset)
            fetched = index + offset
        elif kind == "made":
            made = True
            keys.append(event[2])
        elif kind == "dropped":
            many = True
    if many or running or (step is not None and step[1] < 0):
        step = None
    return _Live(stop + offset, step, (None, last) if backwards == 1 else None,
                 first_step, first_backward, fetch, fetched, made, tuple(keys))


def _decided(steps: list[Step], firm: list[bool], ends: list[int]) -> tuple[int, int] | None:
    """The most steps of a window that are decided (each began for good, and so did the next),
    and where the window is cut after them: the first live step's end after their last update
    (not after the next one's first). None: none is."""
    count = 0
    while count + 1 < len(steps) and firm[count + 1]:
        count += 1
    for k in range(count, 0, -1):
        last = max(update.last for update in steps[k - 1].updates)
        after = [end for end in ends if end > last]
        if after and after[0] <= steps[k].updates[0].begin:
            return k, after[0]
    return None


def _ends(events: Sequence[Event], first: int) -> list[int] | None:
    """Where each live step from ``first`` on ended (its ``ended`` event's cut: :func:`_cut`),
    or None where they are not numbered ``first``, ``first + 1``, ... in order."""
    found = [(index, event[2]) for index, event in enumerate(events)
             if event[0] == "ended" and event[2] >= first]
    if [number for _, number in found] != list(range(first, first + len(found))):
        return None
    return [_cut(events, index) for index, _ in found]


def _trained(step: Step) -> bool:
    return any(update.end is not None for update in step.updates)


def _grouped(events: Sequence[Event], found: list[Step], ends: list[int]) -> list[int]:
    """The report step of each live step ending at ``ends``, by the classifier's steps
    ``found`` (each live step its own where there are none)."""
    if not found:
        return list(range(len(ends)))
    owner = {update.begin: k for k, step in enumerate(found) for update in step.updates}
    begins = sorted(owner)
    # each live step's classifier steps (lowest, highest), None where it held no update
    spans: list[tuple[int, int] | None] = []
    at = 0
    for cut in ends:
        held = []
        while at < len(begins) and begins[at] < cut:
            held.append(owner[begins[at]])
            at += 1
        spans.append((min(held), max(held)) if held else None)
    _lend(spans, ends, events)
    out: list[int] = []
    # the highest classifier step of the open report step
    reach = -1
    for span in spans:
        if out and span is not None and span[0] <= reach:
            out.append(out[-1])
            reach = max(reach, span[1])
        else:
            out.append(out[-1] + 1 if out else 0)
            reach = -1 if span is None else span[1]
    return out


def _starts(grouped: list[int]) -> bytes:
    """A byte a live step: 1 where it begins a report step (the first always does)."""
    return bytes(int(k == 0 or grouped[k] != grouped[k - 1]) for k in range(len(grouped)))


def _lend(spans: list[tuple[int, int] | None], ends: list[int], events: Sequence[Event]) -> None:
    """Give each live step with no update the span of the next one (no batch taken between
    their ends), else of the one before."""
    for k in range(len(spans) - 1, -1, -1):
        if spans[k] is None and k + 1 < len(spans) and spans[k + 1] is not None and not any(
                event[0] == "fetch" for event in events[ends[k]:ends[k + 1]]):
            spans[k] = spans[k + 1]
    for k in range(1, len(spans)):
        if spans[k] is None and spans[k - 1] is not None and not any(
                event[0] == "fetch" for event in events[ends[k - 1]:ends[k]]):
            spans[k] = spans[k - 1]


# the events a live step's end passes over to the one it ended at (see _cut)
_PASSED = ANSWERS | {"ended"}


def _cut(events: Sequence[Event], index: int) -> int:
    """Where the live step whose ``ended`` event is at ``index`` ended: at the event the runner
    was hearing as it ended it (a batch taken, the next step's forward, ``backward()`` or
    update), the last before it that is no answer; the live step holds what came before."""
    at = index - 1
    while at >= 0 and events[at][0] in _PASSED:
        at -= 1
    return max(at, 0)
