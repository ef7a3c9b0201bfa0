"""The depth rule: a queue of step events, and when the host must wait for the oldest."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import ThrottleTimeout
from .events import Event, EventFactory
from .waits import WaitStrategy

__all__ = ["Core", "Subscriber"]

_HISTOGRAM_BUCKETS = 64  # in-flight histogram size when depth is None
_HOOKS = ("before_record", "on_record", "on_dry", "on_fetch", "holds", "on_handout", "on_idle", "on_retire",
          "on_wait_begin", "on_wait")


class Subscriber:
    """What a part of the throttle may hear from the core; every method is optional.

    Parts (device timing, deferred values, a trace, a depth controller, a
    framework callback) subscribe with :meth:`Core.subscribe`. The core calls
    them on the loop's thread; none of them may block or sync, and none of
    them changes the rule. Define only the methods you need (this class is
    documentation; subscribers do not have to inherit from it).
    """

    def before_record(self, step: int, event: Event) -> None:
        """Just before ``step``'s event is recorded: enqueue work the event must cover."""

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        """``step``'s event was recorded at host time ``now`` (None on a synchronous backend)."""

    def on_dry(self, step: int) -> None:
        """The device ran dry during ``step``'s loop body (see ``Core.dry``)."""

    def on_fetch(self, step: int, start: float, seconds: float) -> None:
        """The host took ``step``'s batch from the source (the wrapper), or waited between steps (``begin_step``)."""

    def holds(self) -> bool:
        """Before a hand-out, with steps in flight: True makes the host wait for the oldest one first.

        For budgets other than the depth (memory); asked again after each wait.
        """
        return False

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        """``step`` may start: it is handed to the host with ``in_flight`` earlier steps unfinished."""

    def on_idle(self, step: int) -> None:
        """``step`` is handed out while nothing is queued on the device (it starves)."""

    def on_retire(self, step: int) -> None:
        """``step`` (and every step before it) is seen complete; called in step order."""

    def on_wait_begin(self, step: int) -> None:
        """The host is about to block on ``step``'s event (``core.draining`` says whether in ``drain()``)."""

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        """The host blocked ``seconds`` from ``start`` waiting for ``step``'s event (also after an interrupt)."""


class Core:
    """Steps in flight and the rule that bounds them; knows devices only as events.

    Besides the rule, the core counts what it sees on the way: waits, hand-outs
    by steps in flight (``histogram``), hand-outs with nothing queued
    (``starved``), and loop bodies during which the device ran dry (``dry``):
    at the record of step ``n``, step ``n - 1`` is still queued (it was
    unfinished at ``n``'s hand-out, or it would have been retired there) and
    its event already reports completion -- idle that opened inside the body,
    where no hand-out sees it. That costs one ``query()`` per step, never a sync.

    Only the loop's thread calls the mutating methods (the Throttle enforces
    it). Counters are written by that thread alone; other threads may read
    them, and copy ``pending`` (a C-level copy, atomic under the GIL).

    Args:
        depth: steps allowed in flight, or None (track only).
        new_event: the backend's event factory, or None for a synchronous backend.
        wait: how the host blocks on an event.
        timeout: seconds one wait may take, or None.
        clock: host clock in seconds.
    """

    def __init__(
        self,
        depth: int | None,
        new_event: EventFactory | None,
        wait: WaitStrategy,
        timeout: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.new_event, self.wait_strategy, self.timeout, self.clock = new_event, wait, timeout, clock
        self.pending: deque[Event] = deque()
        self.steps = self.completed = 0
        self.waits = self.starved = self.max_in_flight = self.dry = 0
        self.last_dry = -1  # the last step recorded after a dry body
        self.wait_s = 0.0
        self.draining = False  # drain() is waiting
        self.histogram = [0]
        self.depth: int | None = None
        self.limit: int | None = None
        # One part (device timing) may supply the event of one upcoming step, and be told when that
        # step is handed out with nothing queued: a comparison per step, not a call, on every other step.
        self.special_step = -1
        self.special_event: Callable[[int], Event] | None = None
        self.special_idle: Callable[[int], None] | None = None
        self.before_record: list[Callable[..., Any]] = []
        self.on_record: list[Callable[..., Any]] = []
        self.on_dry: list[Callable[..., Any]] = []
        self.on_fetch: list[Callable[..., Any]] = []
        self.holds: list[Callable[[], bool]] = []
        self.on_handout: list[Callable[..., Any]] = []
        self.on_idle: list[Callable[..., Any]] = []
        self.on_retire: list[Callable[..., Any]] = []
        self.on_wait_begin: list[Callable[..., Any]] = []
        self.on_wait: list[Callable[..., Any]] = []
        self.set_depth(depth)

    @property
    def synchronous(self) -> bool:
        return self.new_event is None

    def set_depth(self, depth: int | None) -> None:
        """Change the bound; the next hand-out obeys it (a controller's lever)."""
        self.depth = depth
        self.limit = None if depth is None else depth - 1
        buckets = (depth or _HISTOGRAM_BUCKETS - 1) + 1
        if buckets > len(self.histogram):
            self.histogram.extend([0] * (buckets - len(self.histogram)))
        self.top = len(self.histogram) - 1  # the last bucket counts "top or more"

    def subscribe(self, part: object) -> None:
        """Call ``part``'s hooks (the methods of :class:`Subscriber` it defines) from now on."""
        for name in _HOOKS:
            hook = getattr(part, name, None)
            if hook is not None and hook not in getattr(self, name):
                getattr(self, name).append(hook)

    def unsubscribe(self, part: object) -> None:
        for name in _HOOKS:
            hook = getattr(part, name, None)
            hooks = getattr(self, name)
            if hook is not None and hook in hooks:
                hooks.remove(hook)

    # -- the rule ----------------------------------------------------------

    def record(self, now: float) -> int:
        """End of a step: one event, recorded after the step's work was enqueued. Returns the step."""
        step = self.steps
        new_event = self.new_event
        if new_event is None:  # synchronous: the step is complete as it ends
            self.completed = self.steps = step + 1
            if self.on_record:
                for hook in self.on_record:
                    hook(step, None, now)
            if self.on_retire:
                _notify(self.on_retire, step)
            return step
        event = self.special_event(step) if step == self.special_step else new_event()  # type: ignore[misc]
        if self.before_record:
            for hook in self.before_record:
                hook(step, event)
        event.record()  # may raise (CUDA graph capture): then the step is not counted
        pending = self.pending
        pending.append(event)
        self.steps = step + 1
        queued = len(pending)
        if queued > self.max_in_flight:
            self.max_in_flight = queued
        if queued > 1 and pending[-2].query():  # the device ran dry in this body (a query, never a sync)
            self.dry += 1
            self.last_dry = step
            for hook in self.on_dry:
                hook(step)
        if self.on_record:
            for hook in self.on_record:
                hook(step, event, now)
        return step

    def admit(self) -> int:
        """Before a step: wait until at most depth - 1 steps are in flight. Returns how many are."""
        pending = self.pending
        if self.new_event is not None:
            limit = self.limit
            if limit is not None:
                while len(pending) > limit:
                    self.wait_for(self.completed)
                    self.retire()
            holds = self.holds
            while holds and pending and any(hold() for hold in holds):
                self.wait_for(self.completed)
                self.retire()
            if pending and pending[0].query():  # retire finished steps without blocking
                if self.on_retire:
                    retire = self.retire
                    retire()
                    while pending and pending[0].query():
                        retire()
                else:  # nobody to tell: the retirements are two operations each
                    pending.popleft()
                    self.completed += 1
                    while pending and pending[0].query():
                        pending.popleft()
                        self.completed += 1
            queued = len(pending)
            top = self.top
            self.histogram[queued if queued < top else top] += 1
            if not queued:
                self.starved += 1
                if self.steps == self.special_step and self.special_idle is not None:
                    self.special_idle(self.steps)
                if self.on_idle:
                    for hook in tuple(self.on_idle):  # a copy: a part may unsubscribe itself here
                        hook(self.steps)
        else:
            queued = 0
        if self.on_handout:
            now = self.clock()
            for hook in self.on_handout:
                hook(self.steps, queued, now)
        return queued

    def wait_for(self, step: int) -> None:
        """Block until recorded step ``step``'s event completes (nothing else is waited for)."""
        event = self.pending[step - self.completed]
        if event.query():
            return
        clock = self.clock
        for hook in self.on_wait_begin:
            hook(step)
        start = clock()
        done = False
        try:
            done = self.wait_strategy(event, self.timeout)  # host-device sync, required by the rule or the caller
        finally:  # an interrupted wait (Ctrl-C) still counts
            waited = clock() - start
            self.waits += 1
            self.wait_s += waited
            for hook in self.on_wait:
                hook(step, start, waited)
        if not done:
            assert self.timeout is not None
            raise ThrottleTimeout(step, self.depth, waited, self.timeout)

    def retire(self) -> None:
        """The oldest step is complete: drop its event, tell the parts."""
        self.pending.popleft()
        step = self.completed
        self.completed = step + 1
        hooks = self.on_retire
        if hooks:
            if len(hooks) == 1:
                hooks[0](step)
            else:
                _notify(hooks, step)

    def wait_until(self, step: int) -> None:
        """Wait for ``step`` and every step before it (no later step), retiring them."""
        if step >= self.steps:
            raise RuntimeError(
                f"step {step} has not ended yet (its event is recorded when the loop moves on): read "
                "deferred values after their step, e.g. in on_complete, thr.latest, or a later step"
            )
        if self.completed <= step:
            self.wait_for(step)  # one wait: on an in-order queue the steps before it are done too
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


def _notify(hooks: list[Callable[..., Any]], step: int) -> None:
    """Call every hook; the first exception (a user's callback) is raised after all of them ran."""
    error: BaseException | None = None
    for hook in tuple(hooks):  # a copy: a part may unsubscribe itself while being told
        try:
            hook(step)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
