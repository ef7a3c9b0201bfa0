"""One loop, one thread: which thread may change a throttle right now."""

from __future__ import annotations

import threading


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
        with self._lock:
            owner = self.owner
            if owner is not None and owner != me:
                self._refuse(what, me)
            if not self._claims:
                self._thread = threading.current_thread()
            self.owner = self.loop_thread = me
            self._claims += 1

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
        with self._lock:
            self._claims = max(0, self._claims - 1)
            if not self._claims:
                self.owner = None

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
