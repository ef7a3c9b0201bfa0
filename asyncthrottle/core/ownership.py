"""One loop, one thread: which thread may change a throttle right now."""

from __future__ import annotations

import threading


class Ownership:
    """A reentrant claim on a throttle by one thread; a second thread gets a ``RuntimeError``, not a
    race.

    Every call that changes the throttle's state (a pass, a step, ``mark()``,
    ``drain()``) claims it for its duration. Reads (``stats``, ``latest``,
    ``in_flight``, ``Deferred.ready()``/``get()``) never claim and never
    change anything, so they are safe from any thread.
    """

    __slots__ = ("_claims", "_lock", "loop_thread", "owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims = 0
        # the thread holding the claim
        self.owner: int | None = None
        # the thread that last claimed: the loop's thread
        self.loop_thread: int | None = None

    def claim(self, what: str) -> None:
        me = threading.get_ident()
        with self._lock:
            if self.owner is not None and self.owner != me:
                raise RuntimeError(
                    f"{what} was called while thread {self.owner} is using this Throttle; a "
                    "Throttle "
                    "serves one loop in one thread -- give each thread its own, or read it only "
                    "(stats, latest, in_flight and Deferred values are safe from any thread)"
                )
            self.owner = self.loop_thread = me
            self._claims += 1

    def release(self) -> None:
        with self._lock:
            self._claims = max(0, self._claims - 1)
            if not self._claims:
                self.owner = None

    def mine(self) -> bool:
        """Whether the calling thread may change the throttle (it owns it, or it runs the loop and
        nobody does)."""
        me = threading.get_ident()
        owner = self.owner
        return owner == me or (owner is None and self.loop_thread in (None, me))
