"""A loop's iterator as the core drives it: each ``next()`` is the rule's one road (record, fetch,
admit)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from .rule import Core

T = TypeVar("T")


class StepIterator(Iterator[T]):
    """Iterates ``items`` under ``core``'s rule: ``next()`` records the step that ran, takes the
    next batch and admits it.

    That is the per-step path of most loops, where one Python call costs as much as the rule. The
    rule's methods are :meth:`Core.record` and :meth:`Core.admit`, written once, in ``rule.py``;
    ``next()`` calls them, except where the core is lean (see ``Core.lean``: no part hears the
    step, and it waits for nothing), where it runs their fast paths in its own frame: the record
    of an event and the retirement of the steps seen complete, no hook told (and a synchronous
    step no part hears: its count). A random-script test holds these fast paths to the general
    methods' decisions. A wrapped loop's pass (``asyncthrottle.view.Pass``) is a
    ``StepIterator`` and adds only its lifecycle. One of docs/architecture.md's hot paths.

    The parts hear the record at the clock's time. The fetch is timed from after the record (the
    parts' work there is not the source's) and told (``Core.fetched``), also when it raises
    (``StopIteration``: the source is exhausted). An error of the admit (a timeout or Ctrl-C in
    the wait, a device error in a query) keeps the batch in ``_held`` first. A ``next()`` with no
    batch handed out (the first, or one after a ``next()`` that raised) goes to :meth:`_begin`
    where the source is new or a batch is held; every error of a step goes to :meth:`_failed`.
    """

    __slots__ = ("_core", "_held", "_items", "in_body")

    def __init__(self, core: Core, items: Iterator[T] | None) -> None:
        self._core = core
        # the source's iterator (None: not started)
        self._items = items
        # the batch whose admit raised, handed out by the next next()
        self._held: list[T] = []
        # a batch was handed out and its step is not recorded yet
        self.in_body = False

    def _begin(self) -> T:
        """A ``next()`` with no step open and no fetch to make: the held batch, admitted again."""
        held = self._held
        if not held:
            raise StopIteration
        item = held.pop()
        try:
            self._core.admit()
        except BaseException:
            # a timeout or Ctrl-C in the wait again
            held.append(item)
            raise
        self._go_on()
        return item

    def _go_on(self) -> None:
        """After a record or an admit whose hooks ran: the loop goes on (a batch is handed out), or
        it was ended meanwhile (a callback closed the throttle) and this ``next()`` ends it as a
        ``break`` would (``StopIteration``), the batch fetched not handed out."""
        if self._items is None:
            raise StopIteration
        self.in_body = True

    def _failed(self, exc: BaseException) -> None:
        """``next()`` raised ``exc``: no batch is handed out."""
        self.in_body = False

    def __next__(self) -> T:
        """The record of the step that ran (if one did), the fetch of the next batch, its admit."""
        core = self._core
        pending = core.pending
        if self.in_body:
            try:
                if core.lean:
                    # Core.record() where no part hears the step (lean): the fast path
                    step = core.steps
                    event = (core.supplier.supply_event(step) if step == core.supplied_step
                             else core.new_event())  # type: ignore[misc]
                    try:
                        # may raise (CUDA graph capture): then the step is not counted
                        event.record()
                    except BaseException:
                        core.drop()
                        raise
                    pending.append(event)
                    core.steps = step + 1
                    queued = len(pending)
                    if queued > core.max_in_flight:
                        core.max_in_flight = queued
                    # the device ran dry in this body (a query, never a sync)
                    if queued > 1 and pending[-2].query():
                        core.dry += 1
                        core.last_dry = step
                        if queued == 2:
                            # the step before, seen complete: retired now
                            pending.popleft()
                elif core.new_event is None and not (core.on_record or core.on_retire):
                    # Core.record() of a synchronous step no part hears: complete as it ends
                    core.steps += 1
                else:
                    # (a hook may end the pass: a callback's close(); the step is recorded once)
                    self.in_body = False
                    core.record()
                    # (_go_on(), inlined: the per-step path of a loop with deferred values)
                    if self._items is None:
                        raise StopIteration
                    self.in_body = True
            except BaseException as exc:
                self._failed(exc)
                raise
        elif self._held or self._items is None:
            return self._begin()
        else:
            self.in_body = True
        clock = core.clock
        start = clock()
        try:
            item = next(self._items)  # type: ignore[arg-type]
        except BaseException as exc:
            # the time it took was still fetching
            core.fetched(core.steps, start, clock() - start)
            self._failed(exc)
            raise
        seconds = clock() - start
        if core.hears_fetch:
            core.fetched(core.steps, start, seconds, True, item)
        else:
            core.fetch_s += seconds
        try:
            # (lean again: the fetch may have subscribed a part)
            if core.lean and len(pending) <= core.limit:  # type: ignore[operator]
                # Core.admit() while no step must be waited for
                last = None
                if pending and pending[0].query():
                    last = pending.popleft()
                    while pending and pending[0].query():
                        last = pending.popleft()
                queued = len(pending)
                if queued:
                    # (lean: queued < depth <= the top bucket)
                    core.histogram[queued] += 1
                else:
                    # the device starves (histogram[0] counts these hand-outs)
                    core.histogram[0] += 1
                    if core.steps == core.supplied_step:
                        core.supplier.supplied_idle(core.steps, last)
            elif core.new_event is not None or core.on_handout:
                self.in_body = False
                core.admit()
                if self._items is None:
                    raise StopIteration
                self.in_body = True
        except BaseException as exc:
            self._held.append(item)
            self._failed(exc)
            raise
        return item


