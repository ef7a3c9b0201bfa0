"""The trainer-agnostic driver of the framework callbacks: begin, end, drain and fail a Throttle's
steps from a trainer's hooks (``asyncthrottle.hooks`` before 0.4)."""

from __future__ import annotations

import bisect
import logging
import pickle
import threading
from typing import Any

from . import _lifecycle
from ._callers import warn_at_user
from .parts.nonfinite import NonFiniteWatch
from .parts.syncaudit import SyncAdvice
from .throttle import Throttle
from .values import OnComplete

__all__ = ["ThrottleHooks", "numeric_stats"]

logger = logging.getLogger("asyncthrottle")


class ThrottleHooks:
    """A :class:`Throttle` driven from a framework's callback hooks; the base of the integrations.

    ``begin()`` waits for room and starts a step, ``end(loss)`` defers the
    loss and records the step (never blocks), ``drain()`` waits for every
    recorded step (an open step stays open: it ends in its own end hook),
    ``fail()`` drops the open step without blocking and ``abandon()`` also
    ends the pass (training stopped). A step begun while the previous one is
    still open (the framework skipped its end hook) records the previous one
    first.

    Step numbers: the framework's own. ``begin(number)`` takes the
    framework's number of the step (the Hugging Face Trainer's global step,
    Lightning's batch index over the fit), which goes on across a resume from
    a checkpoint; :meth:`on_complete` callbacks and the NaN report
    (``nonfinite=``: the warning, ``NonFiniteError.step``,
    ``stats.nonfinite_first``) use it. The throttle keeps its own count (0, 1,
    2, ... over the callback's life: ``throttle.on_complete``, ``stats``, the
    trace); :meth:`framework_step` maps it to the framework's.

    Pickling (``ddp_spawn``, ``copy.deepcopy``) keeps the constructor options
    and the ``on_complete`` callbacks that pickle themselves, and makes a new
    :class:`Throttle` from them on the other side: its counters start at
    zero. A callback that does not pickle (a lambda, a closure) stays behind,
    with a logged warning naming it. Pickle before training starts.

    Args:
        depth: steps allowed in flight (see :class:`Throttle`).
        **throttle_options: keyword options of :class:`Throttle` (``device``,
            ``events``, ``wait``, ``clock``, ``detect_sync``, ...).
    """

    # attributes that never travel with a pickle (reset to None)
    _TRANSIENT: tuple[str, ...] = ()

    def __init__(self, depth: int | None = 2, **throttle_options: Any) -> None:
        if throttle_options.get("to") is not None:
            raise TypeError(
                f"to={throttle_options['to']!r} moves the batches of a wrapped loop, but a "
                "framework's callback never sees them (the framework copies each batch itself): "
                "drop to=, and see asyncthrottle's docs/prefetch.md for how to combine it with the "
                "framework's own copies"
            )
        self._options: dict[str, Any] = {"depth": depth, **throttle_options}
        self.throttle = Throttle(depth, **throttle_options)
        # begin() ran and end()/fail() not yet
        self._open = False
        # when the open step was handed out (the throttle's clock)
        self._began = 0.0
        # the open step's open section (a framework phase), or None
        self._phase: Any = None
        self._advised: set[str] = set()
        # (the throttle's NaN watch and callbacks hold it, never these hooks: no cycle)
        self._numbering = _Numbering()
        self._number_steps()

    def _number_steps(self) -> None:
        """Start the throttle's steps at the framework's numbering: none yet (the identity)."""
        # the framework takes and moves each batch between its step hooks (it drains before an
        # evaluation): that time is fetching, as a wrapped loop's next() is
        # the throttle's loop, driven directly by begin/end/fail (every step: a call less each)
        life = self._life = _lifecycle.of(self.throttle)
        life.fetch_between_steps()
        self._numbering.reset()
        watch = life.part(NonFiniteWatch)
        if watch is not None:
            watch.number = self._numbering

    @property
    def step_open(self) -> bool:
        """True between ``begin()`` and ``end()``/``fail()``."""
        return self._open

    def begin(self, number: int | None = None, at: float | None = None) -> int:
        """Wait until the next step may start (the depth rule) and start it; returns the throttle's
        number of it.

        Args:
            number: the framework's number of the step (see :meth:`framework_step`); None: one
                more than the last step's.
            at: when the step began on the throttle's clock (its host time), if earlier than now
                and not before the last step's end: what came before was the step's (``run``'s
                teacher forward, heard only as the step trains); None: now.
        """
        if self._open:
            logger.debug("asyncthrottle: a step began before the last one ended; recording the "
                         "last one")
            self.end()
        step = self._life.begin_step(at)
        if number is not None:
            self._numbering.moved(step, number)
        self._open = True
        self._began = self._life.clock()
        return step

    def framework_step(self, step: int) -> int:
        """The framework's number of the throttle's step ``step``: what :meth:`on_complete`
        hears."""
        return self._numbering(step)

    def on_complete(self, callback: OnComplete) -> OnComplete:
        """Call ``callback(step, values)`` with each step's values, ``step`` being the framework's
        number of it (:meth:`framework_step`); usable as a decorator.

        As ``throttle.on_complete`` (in step order, never blocks), which hears the throttle's
        own count instead.
        """
        self.throttle.on_complete(_Numbered(self._numbering, callback))
        return callback

    def remove_on_complete(self, callback: OnComplete) -> None:
        """Remove a callback given to :meth:`on_complete`."""
        self.throttle.remove_on_complete(_Numbered(self._numbering, callback))

    def close(self) -> None:
        """Close the throttle (:meth:`Throttle.close`): drop the open step, wait for every recorded
        one, release the throttle's events, buffers and process group; idempotent.

        For a callback that trains no more. The integrations never call it themselves: a callback
        outlives ``fit()``/``train()`` (its stats are read after, and it may serve another fit);
        dropping it frees its throttle at once, without waiting.
        """
        self.fail()
        self.throttle.close()

    def end(self, loss: Any = None, at: float | None = None) -> None:
        """End the open step: defer ``loss`` (if given) as ``"loss"``, record the step. Never
        blocks.

        Args:
            loss: the step's loss, or None.
            at: when the step ended on the throttle's clock (its host time), if earlier than now:
                what came after was not the step's (``run``'s evaluation found after an update);
                None: now.
        """
        if not self._open:
            return
        try:
            if self._phase is not None:
                self.end_phase()
            if loss is not None:
                # a non-blocking copy, ordered before the step's event
                self.throttle.defer(loss, name="loss")
        finally:
            self._open = False
            self._life.end_step(False, at)

    def fail(self) -> None:
        """The open step raised: record nothing, drop its values, block on nothing."""
        # the dropped step forgets its sections
        self._phase = None
        if self._open:
            self._open = False
            self._life.end_step(True)

    def abandon(self, at: float | None = None) -> None:
        """Training stopped (an exception): drop the open step and end the pass. Never blocks.

        The time from ``at`` (the throttle's clock; default now) until the
        next step is not loop time: a failed ``fit()`` or ``train()`` followed
        by another is not billed as fetching.
        """
        self.fail()
        self.throttle.pause(at)

    def drain(self) -> None:
        """Wait for every recorded step (a host-device sync on the last one); never records the open
        step.

        With no step open this also ends the pass (the time until the next
        step, an evaluation or a save, is not loop time). With a step open (a
        checkpoint saved or an evaluation run from inside the step, or from a
        callback that runs before this one) the step is neither recorded nor
        waited for: it ends in its own end hook, with its loss, and the bound
        holds for the next step.
        """
        self.throttle.drain()

    def phase(self, name: str, *, collective: bool = False) -> None:
        """Leave the open phase (if any) and enter section ``name`` of the open step (none open:
        nothing).

        The framework's phases (forward, backward, optimizer) as
        :meth:`~asyncthrottle.Throttle.section` s; ``end()`` leaves the last one.
        """
        self.end_phase()
        if self._open:
            section = self.throttle.section(name, collective=collective)
            section.__enter__()
            self._phase = section

    def end_phase(self) -> None:
        """Leave the open phase, if any."""
        section, self._phase = self._phase, None
        if section is not None:
            section.__exit__(None, None, None)

    def advise(self, key: str, message: str) -> None:
        """Warn once per callback about a framework setting that syncs every step.

        The warning names the user's line that started training (the first frame outside
        asyncthrottle and the framework), and shows for each callback (a sweep, a notebook cell
        run again). A synchronous throttle (the CPU) is never advised: there is no device to sync
        with.
        """
        if key in self._advised or self.throttle.synchronous:
            return
        self._advised.add(key)
        warn_at_user(message, SyncAdvice)

    def log_values(self) -> dict[str, float]:
        """The throttle's stats (the sync audit's among them) as plain floats, keyed
        ``asyncthrottle/<name>``."""
        values = numeric_stats(self.throttle.stats.as_dict())
        return {f"asyncthrottle/{name}": value for name, value in values.items()}

    # -- pickling: options travel, the Throttle is made anew ------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        throttle: Throttle = state.pop("throttle")
        state.pop("_life", None)
        state["_open"] = False
        state["_phase"] = None
        for name in self._TRANSIENT:
            state[name] = None
        callbacks = _lifecycle.of(throttle).values.callbacks
        state["_on_complete"] = [cb for cb in callbacks if _pickles(cb)]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        callbacks = state.pop("_on_complete", [])
        self.__dict__.update(state)
        self.throttle = Throttle(**self._options)
        # the new throttle counts from 0
        self._number_steps()
        for callback in callbacks:
            self.throttle.on_complete(callback)


class _Numbering:
    """The framework's numbers of the throttle's steps (:meth:`ThrottleHooks.framework_step`).

    Called with a throttle step, it returns the framework's number; the throttle's NaN watch and
    the callbacks of :meth:`ThrottleHooks.on_complete` hold it, never the hooks (which hold the
    throttle: a cycle).
    """

    __slots__ = ("offset", "offsets")

    def __init__(self) -> None:
        self.offset = 0
        self.offsets: list[tuple[int, int]] = []

    def reset(self) -> None:
        """None yet: the identity (a new throttle counts from 0)."""
        # the framework's number less the throttle's, and from which throttle step each held
        self.offset, self.offsets = 0, []

    def moved(self, step: int, number: int) -> None:
        """The framework numbers the throttle's step ``step`` ``number``."""
        if number - step != self.offset:
            # the framework's count moved against ours: a new train() or fit(), a resume
            self.offset = number - step
            self.offsets.append((step, self.offset))

    def __call__(self, step: int) -> int:
        offsets = self.offsets
        if not offsets or step >= offsets[-1][0]:
            return step + self.offset
        at = bisect.bisect_right(offsets, step, key=lambda pair: pair[0]) - 1
        return step + (offsets[at][1] if at >= 0 else 0)


class _Numbered:
    """An :meth:`ThrottleHooks.on_complete` callback: hears the framework's step number."""

    __slots__ = ("callback", "numbering")

    def __init__(self, numbering: _Numbering, callback: OnComplete) -> None:
        self.numbering, self.callback = numbering, callback

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        self.callback(self.numbering(step), values)

    def __eq__(self, other: object) -> bool:
        # remove_on_complete() finds it by its hooks' numbering and its callback
        return (isinstance(other, _Numbered) and other.numbering is self.numbering
                and other.callback == self.callback)

    def __hash__(self) -> int:
        return hash((id(self.numbering), self.callback))

    def __repr__(self) -> str:
        return f"{self.callback!r} (the framework's step numbers)"


# inside _pickles(): a callback that holds these hooks must not recurse
_CHECKING = threading.local()


def _pickles(callback: Any) -> bool:
    if getattr(_CHECKING, "active", False):
        return True
    _CHECKING.active = True
    try:
        pickle.dumps(callback)
    except Exception as exc:
        logger.warning("asyncthrottle: the on_complete callback %r does not pickle (%s); it is "
                       "not carried over, register it again after unpickling (e.g. in the new "
                       "process)", callback, exc)
        return False
    finally:
        _CHECKING.active = False
    return True


def numeric_stats(values: dict[str, Any]) -> dict[str, float]:
    """The numbers of a stats dict as floats (strings such as the verdict are left out)."""
    return {name: float(value) for name, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}
