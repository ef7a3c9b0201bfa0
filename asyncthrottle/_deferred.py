"""``Deferred``: one deferred value, readable once its step is complete; ``DonatedValueError``, a
value whose JAX array was donated first."""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._tree import map_leaves
from .backends.snapshots import JAX_ARRAYS, host_leaf, unring_leaf

if TYPE_CHECKING:
    from .core.events import Event

# A value is settled once, by the first of the loop's delivery and another thread's get(): the
# second must not convert a ring slot that the delivery has let go (and overwrite the value).
# Re-entrant: a walk that rebuilds a user's object may run code that reads another value.
_SETTLING = threading.RLock()


class DonatedValueError(RuntimeError):
    """A deferred JAX array was donated to a jitted call before its step completed: its value is
    lost.

    Raised by ``Deferred.get()`` and by the throttle call that delivers the
    step (the hand-out, ``drain()`` or wait that retires it), after the step's
    other values went to ``latest`` and the callbacks.

    Attributes:
        step: the step the value was deferred in.
        name: the value's name.
        seen_at: the step at whose end the deletion was first seen (None: at delivery).
    """

    def __init__(self, step: int, name: str, seen_at: int | None) -> None:
        self.step, self.name, self.seen_at = step, name, seen_at
        seen = (f"seen at the end of step {seen_at}" if seen_at is not None
                else "seen when the step was delivered")
        super().__init__(
            f"the value {name!r} deferred in step {step} was donated before step {step} completed "
            f"({seen}): a jitted call with donate_argnums/donate_argnames took its buffer, and JAX "
            "keeps no host copy of a donated array, so the value is lost; defer an array that no "
            "later call donates (the step's loss output rather than its donated state), or defer a "
            f"device copy: thr.defer(value, name={name!r}, copy=True)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled and copied by its own arguments (a worker's error crosses a process pool)
        return type(self), (self.step, self.name, self.seen_at), self.__dict__

    def _fresh(self) -> DonatedValueError:
        """The same error without a traceback: the kept one is raised as a copy, so that each
        raise has its own frames (none gathered, no cycle through them)."""
        return copy.copy(self)


class Deferred:
    """A value from one step, readable once that step is complete.

    ``ready()`` never blocks. ``get()`` waits for this value's step only --
    never for a later step, never a device-wide sync. Both are safe from any
    thread: from the loop's thread the wait counts as host wait in the
    throttle's stats; from another thread it waits on the step's own event
    and changes nothing in the throttle.

    Attributes:
        step: the step the value belongs to.
        name: its name in ``Throttle.latest`` and ``on_complete`` callbacks.
        unnamed: ``defer()`` chose the name (``"value"``, ``"value_1"``, ...).
    """

    __slots__ = (
        "_copied", "_done", "_dropped", "_event", "_held", "_host", "_lost", "_ringed", "_settled",
        "_wait", "name", "step", "unnamed",
    )

    def __init__(
        self, step: int, name: str, host: Any, wait: Callable[[int, Event | None], None],
        unnamed: bool = False, held: list[Any] | None = None, ringed: bool = False,
    ) -> None:
        self.step, self.name, self.unnamed = step, name, unnamed
        self._host, self._wait = host, wait
        # the step's event, once recorded
        self._event: Event | None = None
        # the step was seen complete
        self._done = False
        # the step ended without an event: the value never arrives
        self._dropped = False
        # JAX arrays held as they are, until the value is on the host
        self._held = held
        # leaves are views into the pinned ring, until the value is on the host
        self._ringed = ringed
        # _host holds the value on the host
        self._settled = False
        # a held array was donated before its step completed
        self._lost: DonatedValueError | None = None
        # events recorded after its copies on streams the step's event cannot join (None: none)
        self._copied: list[Any] | None = None

    def _donated(self, seen_at: int | None) -> bool:
        """Whether a held array was deleted (donated); the first time, remembers where it was seen.
        0.05 us each."""
        if self._lost is None:
            held = self._held
            if not held or not any(array.is_deleted() for array in held):
                return False
            self._lost = DonatedValueError(self.step, self.name, seen_at)
        return True

    def _settle(self) -> Any:
        """The value on the host, made once the step is complete (the device arrays and ring slot
        are let go); made once, by whichever thread asks first (the others find it made)."""
        if not self._settled:
            with _SETTLING:
                if self._settled:
                    return self._host
                copied = self._copied
                if copied:
                    for marker in copied:
                        # host-device sync: this copy's stream is not one the step's event
                        # covers; it was enqueued with the step, so it is done or nearly
                        marker.synchronize()
                host = self._host
                off_cpu = JAX_ARRAYS.get(type(host))
                if off_cpu is not None:
                    # the usual value, one JAX array, without the walk (see host_leaf)
                    numpy = sys.modules["numpy"]
                    self._host = numpy.asarray(host) if off_cpu else numpy.array(host)
                elif self._ringed and type(host) is sys.modules["torch"].Tensor:
                    # the other usual value, one tensor in a ring slot: unring_leaf without the
                    # walk
                    self._host = host.clone()
                else:
                    self._host = map_leaves(host, unring_leaf if self._ringed else host_leaf)
                self._settled, self._held = True, None
        return self._host

    def _recorded(self, event: Event | None) -> None:
        self._event = event
        # a synchronous step is complete as it is recorded
        self._done = event is None

    def ready(self) -> bool:
        """True once the step is complete (never for a dropped value). Queries; never blocks."""
        if self._done:
            return True
        event = self._event
        if event is None or not event.query():
            return False
        copied = self._copied
        return not copied or all(marker.query() for marker in copied)

    def get(self) -> Any:
        """The value on the host, waiting for its step if needed (a host-device sync on that step).

        Raises:
            RuntimeError: the step ended without an event (its body raised, or
                its event could not be recorded), so the value never arrives;
                or the step has not ended yet.
            DonatedValueError: a JAX array of the value was donated before
                its step completed (see ``Throttle.defer``'s ``copy``).
        """
        if self._dropped:
            raise RuntimeError(
                f"the value {self.name!r} of step {self.step} will never arrive: its step ended "
                "without an event (its body raised, or its event could not be recorded)"
            )
        if not self.ready():
            # (the throttle's ValueWait: this thread's way to wait for the step's event)
            self._wait(self.step, self._event)
        if self._donated(None):
            # a new error each time: the kept one gathers no traceback (frames that hold this)
            raise self._lost._fresh()  # type: ignore[union-attr]
        return self._settle()

    def item(self) -> float:
        """The value as a Python number (one-element tensors and arrays)."""
        value = self.get()
        return float(value.item()) if hasattr(value, "item") else float(value)

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        state = "ready" if self.ready() else "pending"
        return f"Deferred(step={self.step}, name={self.name!r}, {state})"
