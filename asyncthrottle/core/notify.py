"""The core's notifications: their names, how one is told, and how a part subscribes to them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from .events import Event

# every notification, in the order of Subscriber's methods
HOOKS = (
    "before_record", "on_record", "on_drop", "on_dry", "on_fetch", "on_batch", "holds",
    "on_handout", "on_idle", "on_retire", "on_wait_begin", "on_wait", "on_pause", "on_sample",
    "on_sections", "on_values",
)
# the hooks a step that waits for nothing may have to tell (its fetch included): with none of them,
# it is lean (on_batch is not one: it is told with the fetch, before the admit either road takes)
STEP_HOOKS = (
    "before_record", "on_record", "on_dry", "on_fetch", "holds", "on_handout", "on_idle",
    "on_retire",
)


def tell_rest(hooks: list[Callable[..., Any]], raised: Callable[..., Any], *args: Any) -> None:
    """Tell the hooks after ``raised``, the one of ``hooks`` whose error is being handled.

    The slow path of every notification loop, written as :func:`tell`'s (its ``except`` calls
    this, then raises), which costs nothing while no hook raises. So a hook that raised (Ctrl-C
    included) hides the notification from no hook after it, and the first error is raised once
    all were told (see :func:`tell_all`).
    """
    tell_all(hooks[next(i for i, hook in enumerate(hooks) if hook is raised) + 1:], *args)


def tell_all(hooks: list[Callable[..., Any]], *args: Any) -> None:
    """While an error is being handled, tell every hook of ``hooks`` all the same.

    A hook's ``Exception`` is dropped (the first error is the one raised); its interrupt (a
    ``BaseException``: Ctrl-C) is raised in place of an ``Exception``, once all were told. The
    error is never held here: a reference to it from a frame of its traceback would be a cycle
    that keeps the loop's pass alive.
    """
    interrupted = not isinstance(sys.exc_info()[1], Exception)
    for i, hook in enumerate(hooks):
        try:
            hook(*args)
        except Exception:
            pass
        except BaseException:
            if not interrupted:
                tell_all(hooks[i + 1:], *args)
                raise


def tell(hooks: list[Callable[..., Any]], *args: Any) -> None:
    """Call every hook of ``hooks`` with ``args``, by the rule of :func:`tell_rest` (a
    notification that is not told every step: one call more)."""
    try:
        for hook in hooks:
            hook(*args)
    except BaseException:
        tell_rest(hooks, hook, *args)
        raise


class Subscriber:
    """What a part of the throttle may hear from the core; every method is optional.

    Parts (device timing, deferred values, a trace, a depth controller, a
    framework callback) subscribe with :meth:`Core.subscribe`. The core calls
    them on the loop's thread; none of them may block or sync, and none of
    them changes the rule. One that raises hides the notification from no
    other part, and the throttle call that told it raises the error. Define
    only the methods you need (this class is documentation; subscribers do
    not have to inherit from it).

    The last three are told by parts, through the core's lists like the
    others: what device timing, sections and the deferred values read once a
    step completed (never a sync; a part that does work only for a listener,
    such as device timing reading its samples as soon as their steps retire,
    asks the core whether anyone listens).
    """

    def before_record(self, step: int, event: Event) -> None:
        """Just before ``step``'s event is recorded: enqueue work the event must cover."""

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        """``step``'s event was recorded at host time ``now`` (None on a synchronous backend)."""

    def on_drop(self, step: int) -> None:
        """``step`` ends without an event (its body raised, or its event could not be recorded):
        drop its data.

        The next step reuses the number ``step``.
        """

    def on_dry(self, step: int) -> None:
        """The device ran dry during ``step``'s loop body (see ``Core.dry``)."""

    def on_fetch(self, step: int, start: float, seconds: float) -> None:
        """The host took ``step``'s batch from the source (the wrapper), or waited between steps
        (``begin_step``)."""

    def on_batch(self, step: int, batch: Any) -> None:
        """A wrapped loop took ``step``'s batch from its source, as the loop will get it (after
        ``to=``'s copy), just after ``on_fetch``; step loops have no batch to tell."""

    def holds(self) -> bool:
        """Before a hand-out, with steps in flight: True makes the host wait for the oldest one
        first.

        For budgets other than the depth (memory); asked again after each wait.
        """
        return False

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        """``step`` may start: it is handed to the host with ``in_flight`` earlier steps
        unfinished."""

    def on_idle(self, step: int) -> None:
        """``step`` is handed out while nothing is queued on the device (it starves)."""

    def on_retire(self, step: int) -> None:
        """``step`` (and every step before it) is seen complete; called in step order."""

    def on_wait_begin(self, step: int) -> None:
        """The host is about to block on ``step``'s event (``core.draining`` says whether in
        ``drain()``)."""

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        """The host blocked ``seconds`` from ``start`` waiting for ``step``'s event (also after an
        interrupt)."""

    def on_pause(self, now: float) -> None:
        """The loop left its pass at host time ``now``: until the next step, the time is not the
        loop's."""

    def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
        """Device timing read sampled ``step``'s device time: ``busy_s`` seconds from its start to
        its end, after ``idle_s`` seconds the device idled before it (0.0 unless it was handed
        out starved).

        Told once its events are complete: as the step retires while anyone listens, else at the
        next sampled step or when the pass ends.
        """

    def on_sections(self, step: int, own_s: float, seconds: dict[str, float]) -> None:
        """Timed ``step``'s sections were read: ``seconds`` by name (the timed ones), ``own_s``
        the sum of its outermost sections that are not ``collective`` (the rank's own work; NaN
        if one of them was not timed)."""

    def on_values(self, step: int, values: dict[str, Any]) -> None:
        """``step``'s deferred values arrived on the host (before the ``on_complete``
        callbacks)."""


class EventSupplier(Protocol):
    """A part that supplies the event of chosen steps (device timing: timing events on sampled steps
    only).

    The core asks it only at the step it named (:meth:`Core.supply_from`, then
    :meth:`Core.supply_next` for each next one), so every other step costs one
    comparison. It may let go while asked (:meth:`Core.stop_supply`, or
    ``unsubscribe``): its later ``supply_next`` calls are then ignored.
    """

    def supply_event(self, step: int) -> Event:
        """The event to record for ``step`` (the step the supplier named last)."""

    def supplied_idle(self, step: int, before: Event | None) -> None:
        """``step``, a supplied one, is handed out with nothing queued on the device.

        ``before``: the event of the step before it, retired at this hand-out (None if it was
        retired earlier).
        """


class Hooks:
    """The core's hook lists (one per notification of :data:`HOOKS`) and the supplier of events.

    A list is replaced, never changed in place (copy on write: a notification
    being told goes on over the old one, and telling copies nothing), so read
    it from the core at each use. Hooks are added and removed only here.
    """

    __slots__ = (
        "before_record", "holds", "on_batch", "on_drop", "on_dry", "on_fetch", "on_handout",
        "on_idle", "on_pause", "on_record", "on_retire", "on_sample", "on_sections", "on_values",
        "on_wait", "on_wait_begin", "supplied_step", "supplier",
    )

    def __init__(self) -> None:
        self.before_record: list[Callable[..., Any]] = []
        self.on_record: list[Callable[..., Any]] = []
        self.on_drop: list[Callable[..., Any]] = []
        self.on_dry: list[Callable[..., Any]] = []
        self.on_fetch: list[Callable[..., Any]] = []
        self.on_batch: list[Callable[..., Any]] = []
        self.holds: list[Callable[[], bool]] = []
        self.on_handout: list[Callable[..., Any]] = []
        self.on_idle: list[Callable[..., Any]] = []
        self.on_retire: list[Callable[..., Any]] = []
        self.on_wait_begin: list[Callable[..., Any]] = []
        self.on_wait: list[Callable[..., Any]] = []
        self.on_pause: list[Callable[..., Any]] = []
        self.on_sample: list[Callable[..., Any]] = []
        self.on_sections: list[Callable[..., Any]] = []
        self.on_values: list[Callable[..., Any]] = []
        # One part (an EventSupplier: device timing) may supply the event of one upcoming step, and
        # be told when that step is handed out with nothing queued: a comparison per step on every
        # other step.
        self.supplied_step = -1
        self.supplier: Any = None

    def _relean(self) -> None:
        """The hooks changed (the core says whether a step that waits for nothing is lean)."""

    def subscribe(self, part: object) -> None:
        """Call ``part``'s hooks (the methods of :class:`Subscriber` it defines) from now on."""
        for name in HOOKS:
            hook = getattr(part, name, None)
            if hook is not None:
                self.listen(name, hook)

    def unsubscribe(self, part: object) -> None:
        """Stop calling ``part``'s hooks (safe while it is being told: see the rules for parts)."""
        for name in HOOKS:
            hook = getattr(part, name, None)
            if hook is not None:
                self.unlisten(name, hook)
        self.stop_supply(part)

    def listen(self, name: str, hook: Callable[..., Any]) -> None:
        """Call ``hook`` for the notification ``name`` (one of :class:`Subscriber`'s methods) from
        now on.

        For a part that needs a hook only for a while (a sample waiting to be read), under a name
        ``subscribe`` does not pick up; ``subscribe`` adds all of a part's hooks at once.
        """
        hooks = getattr(self, name)
        if hook not in hooks:
            setattr(self, name, [*hooks, hook])
            self._relean()

    def unlisten(self, name: str, hook: Callable[..., Any]) -> None:
        """Stop calling ``hook`` for ``name`` (safe while it is being told)."""
        hooks = getattr(self, name)
        if hook in hooks:
            setattr(self, name, [other for other in hooks if other != hook])
            self._relean()

    def supply_from(self, part: EventSupplier, step: int) -> None:
        """``part`` supplies the event of ``step`` (``part.supply_event(step)``); it replaces any
        other supplier."""
        self.supplier, self.supplied_step = part, step

    def supply_next(self, part: EventSupplier, step: int) -> None:
        """``part`` supplies the event of ``step`` next; ignored once ``part`` let go (it may do so
        while asked)."""
        if self.supplier is part:
            self.supplied_step = step

    def release(self) -> None:
        """Tell no one any more: every list emptied, the supplier let go (the throttle is closed, or
        was dropped).

        The parts hold the core and the core holds their hooks: this unties them, so that the last
        reference going frees them all, without the cyclic garbage collector.
        """
        for name in HOOKS:
            setattr(self, name, [])
        self.supplier, self.supplied_step = None, -1
        self._relean()

    def stop_supply(self, part: object) -> None:
        """``part`` supplies no more events; every later step gets the backend's."""
        if self.supplier is part:
            self.supplier, self.supplied_step = None, -1
