"""The hooks' calls kept as a :class:`~asyncthrottle.run.record.Record` (``run --events``): each
call Steps hears, and each answer of the script's state Steps asked for, appended as it comes."""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..framework import ThrottleHooks
from .grouping import Grouper
from .losses import Losses
from .optimizers import Optimizers
from .record import Record
from .source import Source
from .steps import Steps

__all__ = ["RecordingSteps"]


class RecordingSteps(Steps):
    """:class:`~asyncthrottle.run.steps.Steps` that also appends each call it hears to
    ``record`` (and the reads the sync audit counts, through its ``on_read``): the same live
    steps, a record a replay makes them again from (:mod:`asyncthrottle.run.replay`), and the
    report's steps, grouped by the record's classifier at the script's end (``grow``: as the
    record grows, which then keeps a window of it, its events untimed and its losses left out:
    for a record that is not written)."""

    def __init__(self, make: Callable[[Any], ThrottleHooks], sites: Any = None, *,
                 record: Record, collective: bool = False,
                 clock: Callable[[], float] = time.perf_counter, grow: bool = False) -> None:
        def ready(device: Any) -> ThrottleHooks:
            hooks = make(device)
            record.answer("ready")
            return hooks

        super().__init__(ready, sites, collective=collective, clock=clock)
        self.record = record
        # the report's steps, found as the record grows (``grow``: a record not written, whose
        # grouped part is dropped) or at the script's end
        self.grouper = Grouper(record)
        self._grow = grow
        if grow:
            # a record grouped as it grows is never written, and grouping reads no event's time:
            # its events are not timed (a clock read and a float an event less)
            record.clock = _UNTIMED
        self.optimizers = _Optimizers(record)
        self.losses = _Losses()

    # The hooks heard every step append their event to the record's list themselves while it
    # has room (Record.add otherwise: a freed optimizer to file first, or the limit reached),
    # and call Steps' method by name: a call and a super() less an event, on every step.

    def read(self, call: str, where: Any) -> None:
        path, line, via = where
        record = self.record
        via = None if via is None else list(via)
        if len(record.events) < record.room:
            record.events.append(("read", record.clock(), call, path, line, via))
        else:
            record.add("read", call, path, line, via)
        Steps.read(self, call, where)

    def forward(self, grad: bool, module: Any, site: Any = None) -> None:
        # (the site as the hook found it, its code and line: made words as the record is written)
        record = self.record
        if len(record.events) < record.room:
            record.events.append(("forward", record.clock(), grad, site))
        else:
            record.add("forward", grad, site)
        Steps.forward(self, grad, module, site)

    def backward(self, tensors: Any, weights: Any = None) -> None:
        record = self.record
        events = record.events
        if len(events) < record.room:
            index = len(events) + record.offset
            events.append(("backward", record.clock(), None))
        else:
            index = record.add("backward", None)
        losses = self.losses
        losses.last = None
        Steps.backward(self, tensors, weights)
        if not self._grow:
            # (the loss is the written record's: a record grouped as it grows reads no loss)
            record.put(index, 0, losses.last)

    def after_backward(self) -> None:
        self._bare("backward_end")
        Steps.after_backward(self)

    def optimizer_begin(self, optimizer: Any, frame: FrameType) -> None:
        optimizers = self.optimizers
        key = optimizers.keys.get(id(optimizer))
        if key is None:
            key = optimizers.key(optimizer)
        token = optimizers.tokens[id(frame)] = next(optimizers.token)
        record = self.record
        if len(record.events) < record.room:
            record.events.append(("step", record.clock(), key, token))
        else:
            record.add("step", key, token)
        Steps.optimizer_begin(self, optimizer, frame)

    def optimizer_end(self, frame: FrameType) -> None:
        token = self.optimizers.tokens.pop(id(frame), -1)
        record = self.record
        if len(record.events) < record.room:
            record.events.append(("step_end", record.clock(), token))
        else:
            record.add("step_end", token)
        Steps.optimizer_end(self, frame)

    def fetch_begin(self) -> None:
        self._bare("fetch")
        Steps.fetch_begin(self)

    def _bare(self, kind: str) -> None:
        """Append an event of no fields."""
        record = self.record
        if len(record.events) < record.room:
            record.events.append((kind, record.clock()))
        else:
            record.add(kind)

    def fetch_end(self, start: float, seconds: float, stopped: bool,
                  loader: dict[str, Any] | None) -> None:
        record = self.record
        if len(record.events) < record.room:
            record.events.append(("fetched", record.clock(), start, seconds, stopped, loader))
        else:
            record.add("fetched", start, seconds, stopped, loader)
        self._inner = True
        try:
            Steps.fetch_end(self, start, seconds, stopped, loader)
        finally:
            self._inner = False

    def leave(self) -> None:
        self.record.add("eval")
        super().leave()

    def stop(self, at: float | None = None) -> None:
        # (an epoch's end and a framework's fit stop too: recorded as theirs)
        if not self._inner:
            self.record.add("stop", at)
        super().stop(at)

    def load(self, on: bool) -> None:
        self.record.add("load", on)
        super().load(on)

    def stop_on(self, error: Exception) -> None:
        self.record.add("error", repr(error))
        super().stop_on(error)

    def framework_begin(self, source: Source) -> None:
        self.record.add("framework")
        self._inner = True
        try:
            super().framework_begin(source)
        finally:
            self._inner = False

    def framework_end(self, source: Source) -> None:
        self.record.add("framework_end")
        super().framework_end(source)

    def finish(self) -> None:
        self.record.add("finish")
        super().finish()
        if self.runner is not None:
            # the report's steps: the live ones grouped by the classifier's
            self.runner.regroup(self.grouper.starts_all())

    def ended(self, number: int, seconds: float, waited: float) -> None:
        record = self.record
        if len(record.events) < record.room:
            record.events.append(("ended", record.clock(), number, seconds, waited))
        else:
            record.add("ended", number, seconds, waited)
        if self._grow:
            self.grouper.grow()

    # inside a call that stops training itself (its stop() is not the hooks')
    _inner = False
    # (set in __init__: the hooks read them without an isinstance a call)
    losses: _Losses
    optimizers: _Optimizers


# the time of a record's events that nothing reads
_UNTIMED = itertools.repeat(0.0).__next__


class _Losses(Losses):
    """The losses, keeping the last value a ``backward()`` stood for (``last``)."""

    last: Any = None

    def value(self, tensors: Any, weights: Any = None) -> Any:
        self.last = found = super().value(tensors, weights)
        return found


class _Optimizers(Optimizers):
    """The optimizers, each made, freed and stepped one recorded (by a key of the record's, with
    its class and its parameters' ids once), and the answers to Steps' questions of the script's
    state: the parameters' versions when they changed, the optimizer steps an exception ended."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self._record = record
        # each live optimizer's key, by id (a freed one's id leaves as it is freed)
        self.keys: dict[int, int] = {}
        self._count = itertools.count()
        # each running optimizer step's frame (by id) and its token, and the next token
        self.tokens: dict[int, int] = {}
        self.token = itertools.count()
        self._versions = 0

    def key(self, optimizer: Any) -> int:
        """``optimizer``'s key, described in the record the first time."""
        key = self.keys.get(id(optimizer))
        if key is None:
            key = self.keys[id(optimizer)] = next(self._count)
            params = [id(param) for group in getattr(optimizer, "param_groups", ())
                      for param in group.get("params", ())]
            kind = type(optimizer)
            self._record.add("opt", key, [kind.__module__, kind.__name__], params)
            weakref.finalize(optimizer, self._freed, id(optimizer), key)
        return key

    def _freed(self, ident: int, key: int) -> None:
        self.keys.pop(ident, None)
        self._record.free(key)

    def made(self, optimizer: Any) -> None:
        self._record.add("made", self.key(optimizer))
        super().made(optimizer)

    def versions(self) -> int:
        found = super().versions()
        if found != self._versions:
            self._versions = found
            self._record.answer("versions", found)
        return found

    def running(self) -> bool:
        before = len(self.frames)
        alive = super().running()
        if len(self.frames) != before:
            self._record.answer("dropped", before - len(self.frames))
        return alive
