"""Reused events: a backend's event is recorded again only once nothing else refers to it."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.events import Event

# what _count answers where the interpreter keeps no reference counts
_UNKNOWN = 1 << 62
# sys.getrefcount where the interpreter has one (CPython)
_count: Callable[[Any], int] = getattr(sys, "getrefcount", lambda obj: _UNKNOWN)


def _refs_of_oldest(ring: deque[Any]) -> int:
    """References to ``ring[0]``, counted exactly as :meth:`EventPool.__call__` counts them."""
    event = ring[0]
    return _count(event)


def _alone() -> int:
    """The count of an event held by the ring alone, or -1 when counts cannot tell (never reuse
    then)."""
    ring: deque[Any] = deque([object()])
    free = _refs_of_oldest(ring)
    # one more reference, as a Deferred or a pending queue would hold
    holder = ring[0]
    held = _refs_of_oldest(ring)
    del holder
    return free if held == free + 1 < _UNKNOWN else -1


_ALONE = _alone()


class EventPool:
    """A zero-argument event factory that reuses the events nobody holds any more.

    The pool keeps the events it made in a ring, oldest first. To hand one
    out it looks at the oldest: if the ring's reference is the only one left
    -- the core retired its step and dropped it, and no deferred value, device
    timing sample, trace, other thread's copy of the pending queue or user
    holds it -- that event is handed out again and will be re-recorded;
    otherwise a new one is made. So an event is never re-recorded while
    anything still refers to it, and at depth ``d`` about ``d`` events stay
    alive however many steps run. The test is CPython's reference count (one
    call, no lock: the loop's thread alone takes events, and nothing can
    acquire a reference to an event that nothing holds); where counts cannot
    tell, every call makes a new event.

    Only wrap factories of events the library made itself: never a user's.

    Args:
        make: makes a new event (e.g. a ``TorchEvent`` around ``torch.Event``).
        limit: events the ring keeps at most; beyond it the oldest (still
            held by someone) is forgotten, and freed when its holders let go.
    """

    __slots__ = ("_alone", "_make", "_ring", "limit", "made")

    def __init__(self, make: Callable[[], Event], *, limit: int = 64) -> None:
        if limit < 1:
            raise ValueError(f"limit must be an int >= 1 events, got {limit!r}")
        self._make, self.limit = make, limit
        self._ring: deque[Event] = deque()
        self._alone = _ALONE
        # events made so far (the rest of the calls reused one)
        self.made = 0

    def __call__(self) -> Event:
        ring = self._ring
        if ring:
            event = ring[0]
            # the ring's reference is the only one
            if _count(event) <= self._alone:
                ring.rotate(-1)
                return event
        event = self._make()
        self.made += 1
        ring.append(event)
        if len(ring) > self.limit:
            # still held (a kept Deferred, a deep queue): forget it, never reuse it
            ring.popleft()
        return event

    def clear(self) -> None:
        """Let go of the events kept for reuse (the throttle is closed: those held elsewhere stay
        with their holders)."""
        self._ring.clear()

    def __len__(self) -> int:
        """Events the pool keeps (in use or free)."""
        return len(self._ring)
