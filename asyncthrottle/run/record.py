"""The run's record: what the hooks told the runner, as events in one vocabulary, kept raw (it
decides nothing) in a bounded log, written and read back as JSON lines (``run --events``)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ANSWERS", "FIELDS", "FORMAT", "LIMIT", "Record", "load"]

# the file's format: its first line is {"record": FORMAT, ...}
FORMAT = 1
# the events a record keeps; later ones are counted (``dropped``), not kept
LIMIT = 200_000

# each event's fields after its kind and time (the hooks' words)
FIELDS: dict[str, tuple[str, ...]] = {
    # the script made an optimizer (``key``), described once (``opt``) before any use of it
    "opt": ("key", "cls", "params"),
    "made": ("key",),
    "freed": ("key",),
    # a DataLoader's next(): begins, and ends (``start``, ``seconds``; ``stopped``: an epoch's end)
    "fetch": (),
    "fetched": ("start", "seconds", "stopped", "loader"),
    # a module's forward, with grad or not, from its call site (kept as its code and line, written
    # [file, function, first line, line])
    "forward": ("grad", "site"),
    # backward() on ``loss`` (unscaled; None: not a scalar), and its return
    "backward": ("loss",),
    "backward_end": (),
    # an optimizer (``key``) steps, run by a frame (a token pairing the end to its begin)
    "step": ("key", "frame"),
    "step_end": ("frame",),
    # model.eval(); training stops (an epoch's end ``at``); the loader's work heard or not
    "eval": (),
    "stop": ("at",),
    "load": ("on",),
    # a framework's fit/train begins and ends (its own callback finds its steps)
    "framework": (),
    "framework_end": (),
    # a host read of a device value (``call``) at the script's ``path`` and ``line``, ``via`` an
    # installed package's [path, line]
    "read": ("call", "path", "line", "via"),
    # the runner's own error (its repr): the hooks stood aside from then on
    "error": ("error",),
    # the script has ended (its open step ends here)
    "finish": (),
    # the runner's live step ``number`` ended (``seconds`` long, ``waited`` for its batch), at
    # the event heard before this one that is no answer: the report groups live steps by the
    # classifier's (:mod:`~asyncthrottle.run.grouping`)
    "ended": ("number", "seconds", "waited"),
    # answers of the script's state to a question the runner asked while it heard the event
    # before: the optimizers' parameter versions, the optimizer steps an exception ended, and
    # when the runner's throttle was ready (made at the first step: its time is not the step's)
    "versions": ("value",),
    "dropped": ("count",),
    "ready": (),
}
# the events that answer the runner's questions (read ahead by a replay, never heard first)
ANSWERS = frozenset({"versions", "dropped", "ready"})

Event = tuple[Any, ...]


class Record:
    """The events of the loop's thread, in order: ``(kind, time, *fields)`` (:data:`FIELDS`).

    At most ``limit`` events are kept; the rest are counted in ``dropped`` (the record then
    holds the run's beginning). A ``freed`` optimizer is filed before the next hook's event, so
    that an answer always follows the event it answers.

    Args:
        clock: the host clock of the events' times (the runner's).
        limit: the events kept (an int >= 1).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, *,
                 limit: int = LIMIT) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an int >= 1 (the events kept), got {limit!r}")
        self.clock = clock
        self.limit = limit
        self.events: list[Event] = []
        self.dropped = 0
        # the events forgotten before events[0] (see forget(): an add()'s index stays its own)
        self.offset = 0
        self._freed: list[int] = []
        # a hook's event may be appended to ``events`` at once while they hold fewer than this
        # (the limit; 0 while a freed optimizer waits to be filed): else add() keeps it
        self.room = limit

    def add(self, kind: str, *fields: Any) -> int:
        """Append a hook's event; returns its index (-1: not kept)."""
        # (first: a free() from here on sets it again)
        self.room = self.limit
        if self._freed:
            freed, self._freed = self._freed, []
            for key in freed:
                self._keep(("freed", self.clock(), key))
        # (_keep, inlined: every event)
        events = self.events
        if len(events) >= self.limit:
            self.dropped += 1
            return -1
        events.append((kind, self.clock(), *fields))
        return len(events) - 1 + self.offset

    def answer(self, kind: str, *fields: Any) -> None:
        """Append an answer (:data:`ANSWERS`) to the event being heard."""
        self._keep((kind, self.clock(), *fields))

    def free(self, key: int) -> None:
        """The optimizer ``key`` was freed (at any moment: filed before the next event)."""
        self._freed.append(key)
        self.room = 0

    def put(self, index: int, field: int, value: Any) -> None:
        """Set field ``field`` of the event at ``index`` (a value known once the event ran; a
        forgotten event's is dropped)."""
        index -= self.offset
        if 0 <= index < len(self.events):
            event = self.events[index]
            self.events[index] = (*event[:2 + field], value, *event[3 + field:])

    def forget(self, count: int) -> None:
        """Drop the first ``count`` events (a record that is not written, grouped as it grows:
        :class:`~asyncthrottle.run.grouping.Grouper`)."""
        del self.events[:count]
        self.offset += count

    def _keep(self, event: Event) -> int:
        if len(self.events) >= self.limit:
            self.dropped += 1
            return -1
        self.events.append(event)
        return len(self.events) - 1

    def lines(self, head: dict[str, Any], end: dict[str, Any]) -> Iterator[str]:
        """The record as JSON lines: ``head`` (with the format), each event as an object of its
        kind (``e``), time (``t``) and fields, then ``{"end": end}`` with ``dropped``. A loss
        still on the device is read here (the script has ended)."""
        yield json.dumps({"record": FORMAT, "limit": self.limit, **head})
        for kind, at, *values in self.events:
            line = {"e": kind, "t": at, **dict(zip(FIELDS[kind], values, strict=True))}
            if kind == "backward":
                line["loss"] = _plain(line["loss"])
            elif kind == "forward" and line["site"] is not None:
                code, number = line["site"]
                line["site"] = [code.co_filename, code.co_name, code.co_firstlineno, number]
            yield json.dumps(line)
        yield json.dumps({"end": {**end, "dropped": self.dropped}})


def load(text: str) -> tuple[dict[str, Any], list[Event], dict[str, Any]]:
    """A record's head, events and end from its JSON lines (:meth:`Record.lines`).

    Raises:
        ValueError: the text is no record of this format (saying which line and why).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise ValueError("a record has a head line, its events and an end line; this text has "
                         f"{len(lines)} line(s): pass a file written by run --events")
    head = _json(lines[0], 1)
    if not isinstance(head, dict) or head.get("record") != FORMAT:
        raise ValueError(f"line 1 is no head of a record of format {FORMAT} ({lines[0][:80]!r}): "
                         "pass a file written by run --events")
    end = _json(lines[-1], len(lines))
    if not isinstance(end, dict) or not isinstance(end.get("end"), dict):
        raise ValueError(f"the last line ({len(lines)}) is no end of a record: the file is cut "
                         "short (the run may have been killed); run the script again")
    events = [_event(_json(line, k), k) for k, line in enumerate(lines[1:-1], start=2)]
    return head, events, end["end"]


def _event(line: Any, number: int) -> Event:
    kind = line.get("e") if isinstance(line, dict) else None
    if kind not in FIELDS:
        raise ValueError(f"line {number} is no event of a record (kind {kind!r}); the kinds are "
                         f"{', '.join(sorted(FIELDS))}")
    try:
        values = [line[name] for name in FIELDS[kind]]
        at = float(line["t"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"line {number} ({kind}) lacks its time or a field ({exc}): "
                         f"its fields are t, {', '.join(FIELDS[kind]) or '(none)'}") from None
    if kind == "backward" and isinstance(values[0], str):
        values[0] = float(values[0])
    return (kind, at, *values)


def _json(line: str, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise ValueError(f"line {number} is not JSON ({exc})") from None


def _plain(loss: Any) -> float | str | None:
    """A recorded loss for JSON: a float, ``"nan"``/``"inf"``/``"-inf"``, or None."""
    if loss is None:
        return None
    value = float(loss)  # host-device sync: the record is written once the script has ended
    return value if math.isfinite(value) else str(value)
