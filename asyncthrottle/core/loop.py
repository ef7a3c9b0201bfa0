"""A loop's iterator as the core drives it: each ``next()`` is the rule's one road (record, fetch,
admit)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

from .notify import tell_all, tell_rest

if TYPE_CHECKING:
    from .rule import Core

T = TypeVar("T")


class StepIterator(Iterator[T]):
    """Iterates ``items`` under ``core``'s rule: ``next()`` records the step that ran, takes the
    next batch and admits it.

    That is the per-step path of most loops, where one Python call costs as much as the rule, so
    it runs in the frame of ``next()`` itself: a wrapped loop's pass (``asyncthrottle.view.Pass``)
    is a ``StepIterator`` and adds only its lifecycle. The record is written here once, its hooks
    truth tests (:meth:`Core.record` is this road without a fetch: :meth:`record`); the admit of
    a lean core (see ``Core.lean``) is a fast path for the steps that wait for nothing, the
    general :meth:`Core.admit` called otherwise (a random-script test holds the two roads to the
    same decisions). One of docs/architecture.md's hot paths: the record as a method of its own
    measured 2-14% more a step.

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
        # the source's iterator (None: not started, or a core's records alone)
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
        self.in_body = True
        return item

    def _failed(self, exc: BaseException) -> None:
        """``next()`` raised ``exc``: no batch is handed out."""
        self.in_body = False

    def _step(self, record_at: float | None = None) -> T:
        """``next()``; given ``record_at``, only the record of the open step, at that host time
        (:meth:`Core.record`)."""
        core = self._core
        clock = core.clock
        pending = core.pending
        if self.in_body:
            step = core.steps
            try:
                if core.new_event is None:
                    # synchronous: the step is complete as it ends
                    core.steps = step + 1
                    if core.on_record:
                        hooks = core.on_record
                        now = clock() if record_at is None else record_at
                        try:
                            for hook in hooks:
                                hook(step, None, now)
                        except BaseException:
                            tell_rest(hooks, hook, step, None, now)
                            if core.on_retire:
                                # complete all the same
                                tell_all([core.tell_retired], step)
                            raise
                    if core.on_retire:
                        core.tell_retired(step)
                else:
                    event = (core.supplier.supply_event(step) if step == core.supplied_step
                             else core.new_event())
                    try:
                        if core.before_record:
                            hooks = core.before_record
                            try:
                                for hook in hooks:
                                    hook(step, event)
                            except BaseException:
                                tell_rest(hooks, hook, step, event)
                                raise
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
                        if core.on_dry:
                            hooks = core.on_dry
                            try:
                                for hook in hooks:
                                    hook(step)
                            except BaseException:
                                tell_rest(hooks, hook, step)
                                # recorded all the same
                                tell_all(core.on_record, step, event,
                                         clock() if record_at is None else record_at)
                                raise
                        if queued == 2 and not core.on_retire:
                            # the step before, seen complete: retired now (the hand-out would ask
                            # it again)
                            pending.popleft()
                    if core.on_record:
                        hooks = core.on_record
                        now = clock() if record_at is None else record_at
                        try:
                            for hook in hooks:
                                hook(step, event, now)
                        except BaseException:
                            tell_rest(hooks, hook, step, event, now)
                            raise
            except BaseException as exc:
                self._failed(exc)
                raise
            if record_at is not None:
                # Core.record(): no fetch, no admit
                return None  # type: ignore[return-value]
        elif self._held or self._items is None:
            return self._begin()
        else:
            self.in_body = True
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
                core.admit()
        except BaseException as exc:
            self._held.append(item)
            self._failed(exc)
            raise
        return item

    __next__ = _step

    def record(self, now: float) -> None:
        """The record of the step whose body ran, at host time ``now``, without a fetch and an
        admit: :meth:`Core.record`, this road's first half."""
        self.in_body = True
        self._step(now)
