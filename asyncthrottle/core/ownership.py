"""One loop, one thread: which thread may change a throttle right now (none, once it is closed),
and how a deferred value waits for its step from each thread."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .errors import ThrottleTimeout, closed, not_ended
from .waits import Poll

if TYPE_CHECKING:
    from .events import Event
    from .rule import Core


class Ownership:
    """A reentrant claim on a throttle by one thread; a second thread gets a ``RuntimeError``, not a
    race.

    Every call that changes the throttle's state (a pass, a step, ``end_step()``,
    ``mark()``, ``drain()``, ``pause()``) claims it for its duration, through
    :meth:`claim` (or :meth:`check`, for a call that goes on with a claim
    already held). A loop also holds it for its whole pass: a wrapped pass
    from its first batch to its end, a ``step()``/``begin_step()``/``mark()``
    loop from its first step to ``drain()`` or ``pause()`` (:meth:`hold`,
    :meth:`let_go`), so no other thread gets in between two steps. A claim
    whose thread has ended (a worker's step loop that never drained) is void.
    Reads (``stats``, ``latest``, ``in_flight``, ``Deferred.ready()``/``get()``)
    never claim and never change anything, so they are safe from any thread.
    """

    __slots__ = ("_claims", "_lock", "_thread", "held", "loop_thread", "owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims = 0
        # the thread holding the claim, and its Thread (is_alive)
        self.owner: int | None = None
        self._thread: threading.Thread | None = None
        # the thread that last claimed: the loop's thread
        self.loop_thread: int | None = None
        # a step loop's pass holds one of the claims
        self.held = False

    def claim(self, what: str) -> None:
        """Claim the throttle for ``what`` (a call, or a pass) until :meth:`release`."""
        me = threading.get_ident()
        # (the lock's acquire() and release(), not a with block, which makes two bound methods:
        # here and in release(), every begin_step() and end_step())
        lock = self._lock
        lock.acquire()
        try:
            owner = self.owner
            if owner is not None and owner != me:
                self._refuse(what, me)
            if not self._claims:
                self._thread = threading.current_thread()
            self.owner = self.loop_thread = me
            self._claims += 1
        finally:
            lock.release()

    def check(self, what: str) -> None:
        """Raise ``RuntimeError`` where :meth:`claim` would, claiming nothing (``end_step()``
        goes on with ``begin_step()``'s claim)."""
        owner = self.owner
        if owner is not None and owner != threading.get_ident():
            with self._lock:
                self._refuse(what, threading.get_ident())

    def _refuse(self, what: str, me: int) -> None:
        """Another thread holds the throttle: raise, unless that thread has ended (its claim is
        void)."""
        owner = self.owner
        if owner is None or owner == me:
            return
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(
                f"{what} was called while thread {owner} is using this Throttle; a Throttle "
                "serves one loop in one thread (a step() or begin_step() loop keeps it between "
                "steps, until drain() or pause() in its thread) -- give each thread its own, or "
                "read it only (stats, latest, in_flight and Deferred values are safe from any "
                "thread)"
            )
        # its thread ended holding it: void
        self._claims, self.held, self.owner = 0, False, None

    def release(self) -> None:
        lock = self._lock
        lock.acquire()
        try:
            claims = self._claims
            self._claims = claims = claims - 1 if claims > 0 else 0
            if not claims:
                self.owner = None
        finally:
            lock.release()

    def hold(self) -> None:
        """The calling thread's step loop keeps the throttle between its steps (call it with a
        claim held; once a pass)."""
        with self._lock:
            if not self.held and self.owner == threading.get_ident():
                self.held = True
                self._claims += 1

    def let_go(self) -> None:
        """The step loop's pass ended (``drain()``, ``pause()``, a wrapped pass's end)."""
        if self.held:
            self.held = False
            self.release()

    def mine(self) -> bool:
        """Whether the calling thread may change the throttle (it owns it, or it runs the loop and
        nobody does)."""
        me = threading.get_ident()
        owner = self.owner
        return owner == me or (owner is None and self.loop_thread in (None, me))


class Closed(Ownership):
    """The ownership of a closed throttle: every call that would change it raises, naming itself and
    the fix (the throttle's entry points claim it anyway, so a closed throttle costs them nothing
    more)."""

    __slots__ = ()

    def claim(self, what: str) -> None:
        raise RuntimeError(closed(what))

    def check(self, what: str) -> None:
        raise RuntimeError(closed(what))


class ValueWait:
    """How ``Deferred.get()`` waits for an unfinished step: the loop's thread retires every step up
    to it (the wait counted as host wait), any other thread waits on the step's own event alone and
    changes nothing.

    It holds the core and the loop's ownership, never the throttle: a kept ``Deferred`` keeps no
    throttle alive, and after ``close()`` (or once the throttle is dropped) a value of a step still
    in flight is waited for all the same.

    Args:
        core: the throttle's core.
        ownership: the throttle's claim (the loop's thread, while it runs).
    """

    __slots__ = ("core", "ownership")

    def __init__(self, core: Core, ownership: Ownership) -> None:
        self.core, self.ownership = core, ownership

    def __call__(self, step: int, event: Event | None) -> None:
        """Wait until ``step`` (recorded with ``event``; None: not yet) is complete."""
        # not recorded yet: raises, saying so (never runs the core from another thread)
        if event is None:
            raise RuntimeError(not_ended(step))
        core, ownership = self.core, self.ownership
        if ownership.mine():
            ownership.claim("Deferred.get()")
            try:
                core.wait_until(step)  # host-device sync: counted as host wait
            finally:
                ownership.release()
        elif not _PASSIVE(event, core.timeout):  # host-device sync: on that step's own event
            timeout = core.timeout or 0.0
            raise ThrottleTimeout(step, core.depth, timeout, timeout)


# waits of other threads: no state shared with the loop's wait strategy
_PASSIVE = Poll()
