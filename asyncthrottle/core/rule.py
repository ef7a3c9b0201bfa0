"""The depth rule: a queue of step events, and when the host must wait for the oldest."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import ThrottleTimeout, not_ended
from .events import Event, EventFactory
from .notify import STEP_HOOKS, Hooks, tell, tell_all, tell_rest
from .waits import WaitStrategy

# in-flight histogram size at most (the last bucket counts "that many or more")
_HISTOGRAM_BUCKETS = 64
# fetched() without a batch (a step loop's time between steps, a fetch that raised)
_NO_BATCH: Any = object()


class Core(Hooks):
    """Steps in flight and the rule that bounds them; knows devices only as events.

    Besides the rule, the core counts what it sees on the way: waits, hand-outs
    by steps in flight (``histogram``; ``histogram[0]``: with nothing queued,
    the device starving), and loop bodies during which the device ran dry (``dry``):
    at the record of step ``n``, step ``n - 1`` is still queued (it was
    unfinished at ``n``'s hand-out, or it would have been retired there) and
    its event already reports completion -- idle that opened inside the body,
    where no hand-out sees it. That costs one ``query()`` per step, never a sync.
    When that step is the only other one queued and no part hears retirements,
    it is retired there and then (the hand-out would only ask it again).

    A wrapped loop's step is one ``next()`` of its
    :class:`~asyncthrottle.core.loop.StepIterator`: the record of the step that
    ran, the fetch of the next batch (timed: ``fetch_s``) and the admit, in that
    one frame. ``lean`` says that a step which waits for nothing has no part to
    tell and no budget but the depth (the backend is asynchronous, the depth is
    set, and no part listens to records, fetches, retirements, hand-outs or
    holds); the iterator then runs the fast paths of :meth:`record` and
    :meth:`admit` in its frame, the whole per-step cost of a plain loop (a
    random-script test holds the two roads to the same decisions), and calls
    them otherwise. Hooks are added and removed only through
    :meth:`subscribe`/:meth:`listen` and their inverses
    (:class:`~asyncthrottle.core.notify.Hooks`), which keep ``lean`` true.

    Only the loop's thread calls the mutating methods (the Throttle enforces
    it). Counters are written by that thread alone; other threads may read
    them, and copy ``pending`` (a C-level copy, atomic under the GIL). A
    retirement is a ``popleft`` of ``pending``: ``completed`` is derived
    (``steps - len(pending)``), so no counter can drift from the queue.

    Rules for parts: each notification goes to the parts subscribed when it
    starts (the hook lists are replaced, never changed in place: read them from
    the core at each use) (a part may subscribe or unsubscribe any part, itself included,
    while being told, and no other part misses it); retirements are told in
    step order and never nest (a part that waits while being told of step
    ``n`` -- a ``drain()`` in a callback -- queues the steps it retires,
    which are told after every part has heard of ``n``); in every
    notification a part that raised (Ctrl-C included) does not hide it from
    the parts after it (the first error is raised once all were told: see
    :func:`tell_rest`), and a step whose record a part raised at is still
    recorded (on a synchronous backend, retired too).

    Args:
        depth: steps allowed in flight, or None (track only).
        new_event: the backend's event factory, or None for a synchronous backend.
        wait: how the host blocks on an event.
        timeout: seconds one wait may take, or None.
        clock: host clock in seconds.
    """

    __slots__ = (
        "_telling", "_untold", "clock", "depth", "draining", "dry", "fetch_s",
        "hears_fetch", "histogram", "last_dry", "lean", "limit", "max_in_flight", "new_event",
        "pending", "steps", "timeout", "top", "wait_s", "wait_strategy", "waits",
    )

    def __init__(
        self,
        depth: int | None,
        new_event: EventFactory | None,
        wait: WaitStrategy,
        timeout: float | None,
        clock: Callable[[], float],
    ) -> None:
        super().__init__()
        self.new_event, self.wait_strategy = new_event, wait
        self.timeout, self.clock = timeout, clock
        self.pending: deque[Event] = deque()
        self.steps = 0
        self.waits = self.max_in_flight = self.dry = 0
        # the last step recorded after a dry body
        self.last_dry = -1
        self.wait_s = 0.0
        # host seconds taking batches from a wrapped loop's source
        self.fetch_s = 0.0
        self.draining = False
        self.histogram = [0]
        self.depth: int | None = None
        self.limit: int | None = None
        # retirements are being told (they never nest)
        self._telling = False
        # steps retired while telling, told in order after
        self._untold: deque[int] = deque()
        self.lean = False
        # a part hears fetches or batches (on_fetch, on_batch): one truth test a fetch, as lean's
        self.hears_fetch = False
        self.set_depth(depth)

    @property
    def completed(self) -> int:
        """Steps retired: seen complete, in order (the recorded steps not in ``pending``)."""
        return self.steps - len(self.pending)

    @property
    def synchronous(self) -> bool:
        return self.new_event is None

    def set_depth(self, depth: int | None) -> None:
        """Change the bound; the next hand-out obeys it (a controller's lever)."""
        self.depth = depth
        self.limit = None if depth is None else depth - 1
        # Buckets 0..depth, at most _HISTOGRAM_BUCKETS of them: memory does not grow with the depth.
        buckets = min(depth or _HISTOGRAM_BUCKETS, _HISTOGRAM_BUCKETS - 1) + 1
        if buckets > len(self.histogram):
            self.histogram.extend([0] * (buckets - len(self.histogram)))
        # the last bucket counts "top or more"
        self.top = len(self.histogram) - 1
        self._relean()

    def wrap_wait(self, wrap: Callable[[WaitStrategy, float | None], WaitStrategy]) -> None:
        """Wait with ``wrap(strategy, timeout)`` from now on, given the strategy and the timeout in
        force: a part that watches the waits (the stall report's deadline) keeps the
        :class:`~asyncthrottle.core.waits.WaitStrategy` protocol."""
        self.wait_strategy = wrap(self.wait_strategy, self.timeout)

    def release(self) -> None:
        """The throttle is closed or dropped: no part is told any more and nothing more is recorded
        (see :meth:`Hooks.release`). The counters and the queue stay: a value kept by the user still
        waits for its step (``Deferred.get()``)."""
        super().release()

    def _relean(self) -> None:
        self.lean = (self.new_event is not None and self.limit is not None and self.limit < self.top
                     and not any(getattr(self, name) for name in STEP_HOOKS))
        self.hears_fetch = bool(self.on_fetch or self.on_batch)

    # -- the rule ----------------------------------------------------------

    def record(self, now: float | None = None) -> int:
        """End of a step: one event, recorded after the step's work was enqueued, the parts told
        at host time ``now`` (None: the clock's now, read only if a part hears it). Returns the
        step.

        The first half of a loop's ``next()`` (:class:`~asyncthrottle.core.loop.StepIterator`,
        which runs it inlined while the core is lean), ``end_step()``'s and ``mark()``'s record.
        A step whose record a part raised at is still recorded (on a synchronous backend, retired
        too); one whose event cannot be recorded (CUDA graph capture) is dropped, not counted.
        """
        step = self.steps
        if self.new_event is None:
            # synchronous: the step is complete as it ends
            self.steps = step + 1
            if self.on_record:
                hooks = self.on_record
                now = self.clock() if now is None else now
                try:
                    for hook in hooks:
                        hook(step, None, now)
                except BaseException:
                    tell_rest(hooks, hook, step, None, now)
                    if self.on_retire:
                        # complete all the same
                        tell_all([self.tell_retired], step)
                    raise
            if self.on_retire:
                self.tell_retired(step)
            return step
        pending = self.pending
        event = (self.supplier.supply_event(step) if step == self.supplied_step
                 else self.new_event())
        try:
            if self.before_record:
                hooks = self.before_record
                try:
                    for hook in hooks:
                        hook(step, event)
                except BaseException:
                    tell_rest(hooks, hook, step, event)
                    raise
            # may raise (CUDA graph capture): then the step is not counted
            event.record()
        except BaseException:
            self.drop()
            raise
        pending.append(event)
        self.steps = step + 1
        queued = len(pending)
        if queued > self.max_in_flight:
            self.max_in_flight = queued
        # the device ran dry in this body (a query, never a sync)
        if queued > 1 and pending[-2].query():
            self.dry += 1
            self.last_dry = step
            if self.on_dry:
                try:
                    tell(self.on_dry, step)
                except BaseException:
                    # recorded all the same
                    tell_all(self.on_record, step, event, self.clock() if now is None else now)
                    raise
            if queued == 2 and not self.on_retire:
                # the step before, seen complete: retired now (the hand-out would ask it again)
                pending.popleft()
        if self.on_record:
            hooks = self.on_record
            now = self.clock() if now is None else now
            try:
                for hook in hooks:
                    hook(step, event, now)
            except BaseException:
                tell_rest(hooks, hook, step, event, now)
                raise
        return step

    def fetched(self, step: int, start: float, seconds: float, counted: bool = True,
                batch: Any = _NO_BATCH) -> None:
        """The host spent ``seconds`` from ``start`` taking ``step``'s batch: count them in
        ``fetch_s`` (unless not ``counted``: a step loop's time between steps, heard as a fetch),
        tell the parts (``on_fetch``), then, given the ``batch`` a wrapped loop took, its hearers
        (``on_batch``)."""
        if counted:
            self.fetch_s += seconds
        if self.on_fetch:
            tell(self.on_fetch, step, start, seconds)
        if batch is not _NO_BATCH and self.on_batch:
            tell(self.on_batch, step, batch)

    def drop(self) -> None:
        """The step being run ends without an event: its parts drop it (its number is used
        again)."""
        tell(self.on_drop, self.steps)

    def pause(self, now: float) -> None:
        """The loop left its pass (it ended, broke, or drained between epochs): tell the parts."""
        tell(self.on_pause, now)

    def admit(self) -> int:
        """Before a step: wait until at most depth - 1 steps are in flight. Returns how many are."""
        pending = self.pending
        if self.new_event is None:
            queued = 0
        else:
            # the event retired last here (a supplier hears of it at an idle hand-out)
            last = None
            limit = self.limit
            if limit is not None and len(pending) > limit:
                while len(pending) > limit:
                    # the oldest step (wait_for and retire, inlined: the per-step path of a
                    # device-bound loop)
                    step = self.steps - len(pending)
                    if not pending[0].query():
                        self._block(step, pending[0])
                    last = pending.popleft()
                    if self.on_retire:
                        self.tell_retired(step)
            if self.holds:
                holds = self.holds
                while pending and any(hold() for hold in holds):
                    self.wait_for(self.completed)
                    last = self.retire()
            # retire finished steps without blocking
            if pending and pending[0].query():
                if self.on_retire:
                    tell = self.tell_retired
                    # Core.retire, inlined: the per-step path of a loop with deferred values
                    while True:
                        step = self.steps - len(pending)
                        last = pending.popleft()
                        tell(step)
                        if not (pending and pending[0].query()):
                            break
                else:
                    # nobody to tell: a retirement is a popleft
                    last = pending.popleft()
                    while pending and pending[0].query():
                        last = pending.popleft()
            queued = len(pending)
            if queued:
                top = self.top
                self.histogram[queued if queued < top else top] += 1
            else:
                # The device starves: histogram[0] counts these hand-outs.
                self.histogram[0] += 1
                if self.steps == self.supplied_step:
                    self.supplier.supplied_idle(self.steps, last)
                hooks = self.on_idle
                if hooks:
                    try:
                        for hook in hooks:
                            hook(self.steps)
                    except BaseException:
                        tell_rest(hooks, hook, self.steps)
                        raise
        hooks = self.on_handout
        if hooks:
            now = self.clock()
            try:
                for hook in hooks:
                    hook(self.steps, queued, now)
            except BaseException:
                tell_rest(hooks, hook, self.steps, queued, now)
                raise
        return queued

    def wait_for(self, step: int) -> None:
        """Block until recorded step ``step``'s event completes (nothing else is waited for)."""
        pending = self.pending
        event = pending[step - self.steps + len(pending)]
        if not event.query():
            self._block(step, event)

    def _block(self, step: int, event: Event) -> None:
        """Wait for ``step``'s unfinished ``event`` with the strategy, timed and told."""
        clock = self.clock
        if self.on_wait_begin:
            tell(self.on_wait_begin, step)
        start = clock()
        done = False
        try:
            done = self.wait_strategy(event, self.timeout)  # host-device sync: rule or caller asks
        finally:
            # an interrupted wait (Ctrl-C) still counts
            waited = clock() - start
            self.waits += 1
            self.wait_s += waited
            if self.on_wait:
                tell(self.on_wait, step, start, waited)
        if not done:
            assert self.timeout is not None
            raise ThrottleTimeout(step, self.depth, waited, self.timeout)

    def retire(self) -> Event:
        """The oldest step is complete: drop its event (returned), tell the parts."""
        pending = self.pending
        step = self.steps - len(pending)
        event = pending.popleft()
        if self.on_retire:
            self.tell_retired(step)
        return event

    def tell_retired(self, step: int) -> None:
        """Tell every part of ``step``'s retirement, then of the steps retired meanwhile: in order,
        never nested."""
        untold = self._untold
        # a part waited while being told of an earlier step: that one comes first
        if self._telling:
            untold.append(step)
            return
        self._telling = True
        error: Exception | None = None
        try:
            # steps left by an interrupted telling (Ctrl-C in a callback) go first
            if untold:
                untold.append(step)
                step = untold.popleft()
            while True:
                hooks = self.on_retire
                try:
                    for hook in hooks:
                        hook(step)
                except Exception as exc:
                    # a user's callback: the other parts still hear of the step, and of the steps
                    # retired meanwhile (a later hook's interrupt is raised now)
                    tell_rest(hooks, hook, step)
                    error = error or exc
                except BaseException:
                    # Ctrl-C: raised once the other parts heard of the step (the steps retired
                    # meanwhile are told at the next telling)
                    tell_rest(hooks, hook, step)
                    raise
                if not untold:
                    break
                step = untold.popleft()
            if error is not None:
                raise error
        finally:
            self._telling = False
            # the error's traceback holds this frame: no cycle keeps the loop's pass alive
            error = None

    def wait_until(self, step: int) -> None:
        """Wait for ``step`` and every step before it (no later step), retiring them."""
        if step >= self.steps:
            raise RuntimeError(not_ended(step))
        if self.completed <= step:
            # one wait: on an in-order queue the steps before it are done too
            self.wait_for(step)
        while self.completed <= step:
            self.wait_for(self.completed)
            self.retire()

    def drain(self) -> None:
        """Wait for every recorded step (a host-device sync for the last one)."""
        if self.completed < self.steps:
            self.draining = True
            try:
                self.wait_until(self.steps - 1)
            finally:
                self.draining = False

