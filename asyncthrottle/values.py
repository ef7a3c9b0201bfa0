"""Deferred values on their way to the host: ``Completions`` registers each step's values and
delivers them, in step order, once the step completes.

The tree walk is :mod:`asyncthrottle._tree`; a value's snapshot (per framework) and the ring copies
of CUDA and XPU tensors are in ``backends/`` (``snapshots.py``, ``ringcopies.py``); ``Deferred`` is
in :mod:`asyncthrottle._deferred`.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._deferred import Deferred, DonatedValueError
from ._tree import map_leaves
from .backends import snapshots
from .backends.ringcopies import RingCopies
from .backends.snapshots import JAX_ARRAYS, Snapshot
from .core.errors import closed
from .core.notify import tell_rest

if TYPE_CHECKING:
    from .core.events import Event
    from .core.rule import Core

__all__ = ["Completions", "Deferred", "DonatedValueError", "OnComplete"]

OnComplete = Callable[[int, dict[str, Any]], None]


class Completions:
    """Deferred values and ``on_complete`` callbacks; subscribes to the core on first use.

    It tells the parts each step's values (``Subscriber.on_values``, the core's
    list) before the callbacks; a throttle that defers nothing tells nothing.

    A value belongs to the step the host is in when it is deferred. Its step's
    event is attached when the step is recorded; when the core retires the
    step, its values go to :attr:`latest` and to every callback. The values of
    a step that ended without an event (its body raised, or its record failed)
    are dropped with it (:meth:`on_drop`): their ``get()`` says so.

    A name deferred more than once in a step (gradient accumulation) keeps
    every value: it maps to the list of them, in order.

    Args:
        core: the throttle's core.
        wait: how ``Deferred.get()`` waits for an unfinished step (its number and event; the
            throttle's :class:`~asyncthrottle.core.ownership.ValueWait`).
    """

    def __init__(self, core: Core, wait: Callable[[int, Event | None], None]) -> None:
        self.core, self._wait = core, wait
        # the current step's values, until it is recorded
        self.open: list[Deferred] = []
        # unretired values holding JAX arrays, in step order
        self.holding: deque[Deferred] = deque()
        # CUDA (or XPU) tensors' copies into the pinned ring, and their order before step events
        self.copies = RingCopies(core)
        # recorded steps' values, until retired
        self.recorded: deque[tuple[int, list[Deferred]]] = deque()
        self.latest: dict[str, Any] = {}
        self.callbacks: list[OnComplete] = []
        # the core's on_values hooks (the parts') as last seen, and the callbacks: told in order,
        # the parts' first (replaced, never changed in place)
        self.heard: list[OnComplete] = []
        self.told: list[OnComplete] = []
        self._subscribed = False
        # the throttle was closed: nothing more is deferred or registered
        self._closed = False

    def defer(self, value: Any, name: str | None, copy: bool = False) -> Deferred:
        """The snapshot of ``value`` (see :class:`~asyncthrottle.backends.snapshots.Snapshot`), a
        value of the current step named ``name`` (None: ``"value"``, ``"value_1"``, ...)."""
        open_ = self.open
        if not open_ and copy is False and self._subscribed and (type(name) is str or name is None):
            # The usual call: the step's first value (no name to check), one JAX array or one torch
            # tensor: the snapshot of the walk below, without the walk. tests/test_values.py holds
            # the two to the same results.
            unnamed = name is None
            named = "value" if name is None else name
            kind = type(value)
            off_cpu = JAX_ARRAYS.get(kind)
            if off_cpu is not None:
                if off_cpu:
                    value.copy_to_host_async()
                # (positional: a call with keywords costs more, once a step)
                deferred = Deferred(self.core.steps, named, value, self._wait, unnamed, [value])
                open_.append(deferred)
                return deferred
            torch = sys.modules.get("torch")
            if torch is not None and kind is torch.Tensor:
                # (core.synchronous, without the property's call)
                host, ringed = snapshots.tensor_snapshot(value, self.core.new_event is None,
                                                         self.copies)
                deferred = Deferred(self.core.steps, named, host, self._wait, unnamed, None,
                                    ringed)
                open_.append(deferred)
                return deferred
        if name is not None and not isinstance(name, str):
            raise TypeError(f"defer() name must be a str or None, got {name!r}")
        if not self._subscribed:
            self._subscribe("defer()")
        unnamed = name is None
        open_ = self.open
        taken = {deferred.name for deferred in open_} if open_ else ()
        # "value", then "value_1", ...: the first default name no value of the step has
        if name is None:
            k = sum(1 for deferred in open_ if deferred.unnamed)
            name = "value" if not k else f"value_{k}"
            while name in taken:
                k += 1
                name = f"value_{k}"
        elif name in taken and any(deferred.unnamed and deferred.name == name
                                   for deferred in open_):
            raise ValueError(
                f"defer(name={name!r}): an unnamed value of this step already has the default name "
                f"{name!r}; name that value too, or pick another name"
            )
        if copy is not False and copy is not True:
            raise TypeError(f"defer() copy must be True or False, got {copy!r}")
        copier = Snapshot(self.core.new_event is None, copy, self.copies)
        host = map_leaves(value, copier)
        deferred = Deferred(self.core.steps, name, host, self._wait, unnamed=unnamed,
                            held=copier.held or None, ringed=copier.ringed)
        open_.append(deferred)
        return deferred

    def add(self, callback: OnComplete) -> None:
        if not callable(callback):
            raise TypeError(f"on_complete needs a callable(step, values), got {callback!r}")
        self._subscribe("on_complete()")
        # copied on write: a delivery goes on over the old list
        self.callbacks = [*self.callbacks, callback]
        self.told = [*self.heard, *self.callbacks]

    def remove(self, callback: OnComplete) -> None:
        try:
            callbacks = list(self.callbacks)
            callbacks.remove(callback)
            self.callbacks = callbacks
            self.told = [*self.heard, *callbacks]
        except ValueError:
            raise ValueError(f"{callback!r} is not registered with on_complete(); nothing to "
                             "remove") from None

    def on_drop(self, step: int) -> None:
        """The current step ended without an event: its values will never arrive (``get()`` says
        so)."""
        for deferred in self.open:
            deferred._dropped = True
        # (the ring copies' stream keys are kept: the copies were enqueued and write into their
        # ring slots, which are taken again only after the step of that number retires; the next
        # recorded step, of the same number, joins their streams, so that retirement comes after)
        self.open = []

    # -- the core's notifications -----------------------------------------------

    def before_record(self, step: int, event: Event) -> None:
        """Give a JAX event the step's held arrays to wait on (``cover``); order the step's event
        after the ring copies enqueued on other CUDA or XPU streams (see
        :meth:`RingCopies.order <asyncthrottle.backends.ringcopies.RingCopies.order>`)."""
        values = self.open
        arrays: list[Any] | None
        if len(values) == 1:
            # the usual step: one value (its list is read, never changed, by cover())
            arrays = values[0]._held
        else:
            arrays = []
            # (a loop, not a comprehension: 3.11 makes a comprehension a call)
            for deferred in values:
                held = deferred._held
                if held:
                    arrays += held
        if arrays:
            cover = getattr(event, "cover", None)
            if cover is not None:
                cover(arrays)
        copies = self.copies
        if copies.keys:
            # (kept until the step's number moves on: a record that fails, as under CUDA graph
            # capture, drops the step, and the next step's event must cover these copies instead)
            markers = copies.order(step, event)
            if markers:
                for deferred in values:
                    deferred._copied = markers

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        values = self.open
        holding = self.holding
        if values:
            self.open = []
            done = event is None
            for deferred in values:
                # Deferred._recorded, inlined: the per-step path
                deferred._event, deferred._done = event, done
                if deferred._held:
                    holding.append(deferred)
            # (a step with no value has no entry: its retirement delivers an empty dict)
            self.recorded.append((step, values))
        # a donation in this step's body is seen here: one is_deleted() an array (0.05 us)
        for deferred in holding:
            # (read once: a get() of a complete step, from any thread, settles it and lets its
            # arrays go before the step retires)
            held = deferred._held
            if held and deferred._lost is None:
                for array in held:
                    if array.is_deleted():
                        deferred._donated(step)
                        break

    def on_retire(self, step: int) -> None:
        """``step`` is complete: its values go to ``latest`` and the callbacks. Never blocks."""
        recorded = self.recorded
        deferreds = recorded.popleft()[1] if recorded and recorded[0][0] == step else ()
        if not deferreds and recorded and recorded[0][0] < step:
            # steps retired but never told here (Ctrl-C between a retirement and its telling):
            # theirs first, in order
            while recorded and recorded[0][0] < step:
                self.on_retire(recorded[0][0])
            deferreds = recorded.popleft()[1] if recorded and recorded[0][0] == step else ()
        holding = self.holding
        while holding and holding[0].step <= step:
            holding.popleft()
        copies = self.copies
        if copies.copied:
            # before the settles read the slots those copies write
            copies.release(step)
        lost: DonatedValueError | None = None
        values: dict[str, Any] = {}
        # names deferred more than once in the step: their value is the list of them
        repeated: set[str] | None = None
        for deferred in deferreds:
            deferred._done = True
            # a value kept by the user does not keep its step's event from reuse
            deferred._event = None
            if deferred._lost is None:
                try:
                    # the step is complete: no wait
                    value = deferred._settle()
                except RuntimeError:
                    # a JAX array donated since the last record raises here (one call an array
                    # fewer than asking first)
                    if not deferred._donated(None):
                        raise
                else:
                    name = deferred.name
                    if name not in values:
                        values[name] = value
                    elif repeated is not None and name in repeated:
                        values[name].append(value)
                    else:
                        values[name] = [values[name], value]
                        repeated = {name} if repeated is None else repeated | {name}
                    continue
            # raised once the step's other values are delivered
            lost = lost or deferred._lost
        if copies.ring is not None:
            # after the settles: their values were copied out of the slots
            copies.ring.retire(step)
        self.latest.update(values)
        heard = self.core.on_values
        if heard is not self.heard:
            # a part subscribed or unsubscribed (the core's lists are replaced, never changed)
            self.heard = heard
            self.told = [*heard, *self.callbacks]
        # the parts (Subscriber.on_values), then every callback, see every step (the core's rule:
        # see tell_rest); the first error is raised after
        told = self.told
        try:
            for callback in told:
                callback(step, values)
        except BaseException as exc:
            tell_rest(told, callback, step, values)
            if lost is None or not isinstance(exc, Exception):
                raise
        if lost is not None:
            raise lost._fresh()

    def _subscribe(self, what: str) -> None:
        """Hear the core from the first value or callback on; ``what`` (that call) on a closed
        throttle raises."""
        if self._closed:
            raise RuntimeError(closed(what))
        if not self._subscribed:
            self._subscribed = True
            self.core.subscribe(self)

    def close(self) -> None:
        """The throttle is closed (its steps drained, or dropped): let go of the pinned ring and of
        the values never recorded; ``latest`` stays. A later ``defer()`` or ``on_complete()``
        raises."""
        self._closed, self._subscribed = True, False
        self.copies.close()
        # (their get() says they never arrive)
        self.on_drop(self.core.steps)

