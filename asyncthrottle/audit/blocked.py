"""How long the script's thread blocked in a read whose method it looked up: a one-shot profile
function, installed at a counted read only, times the call of torch's own method."""

from __future__ import annotations

import dis
import sys
import time
from collections.abc import Callable, Collection
from types import CodeType, FrameType
from typing import Any

__all__ = ["ReadTimer"]

# the script's instruction that looked the method up: the method is called next (loss.item()),
# once its arguments are computed; any other instruction (CALL of float, a jump on `if loss:`,
# FORMAT_VALUE) made C look it up and call it at once
_LOOKUPS = frozenset(dis.opmap[name] for name in ("LOAD_METHOD", "LOAD_ATTR") if name in dis.opmap)
# the profile events a looked-up method's call may wait behind (its arguments' calls) before the
# lookup is taken for one never called (f = loss.item)
_ARGUMENT_EVENTS = 64
# what the timer waits for: the lookup's own return; the call of the method looked up, or the
# end of a read C called at once; a C read to return; a Python read's frame to return; paused
# while a lookup inside either of the last two waits runs (it says whether it is a new read or
# one inside the timed one: str(x) looks up __repr__, __format__ looks up item), then the return
# of that lookup
_IDLE, _GETTER, _CALLED, _C_READ, _PY_READ, _PAUSED, _RESUMED = range(7)


class ReadTimer:
    """Times one read at a time on the script's thread, from where the read's method is looked
    up (``_Read.__get__``, which adds no frame: the script calls torch's own method).

    :meth:`arm` is called by a counted read's lookup, and the lookup then installs
    :attr:`profile` (``sys.setprofile``). The profile function hears the lookup's own return,
    then times:

    - a method call (``loss.item()``): from its ``c_call`` to its ``c_return``/``c_exception``
      (a C method), or from its frame's ``call`` to that frame's ``return`` (torch's Python
      methods: ``unique``, ``__format__``); the arguments' own calls in between are not timed;
    - a read C calls at once (``float(loss)``, ``if loss:``, ``f"{loss}"``, ``str(x)``): from the
      lookup's return to the next event, or to the return of the Python method C called
      (``__repr__``, ``__format__``). Which of the two a lookup was, the script's instruction
      that made it says, asked only when an event is neither the method's call nor its end.

    Then it removes itself. A method looked up and never called (``f = loss.item``) is timed as
    nothing once its frame returns or after ``_ARGUMENT_EVENTS`` other events. Another lookup
    while one waits, or inside a Python read, removes the profile function until the lookup
    says what it is (so the runner's own work in it is not heard): a counted read ends a
    waiting one's timing (``map(float, losses)``) and is timed in turn (:meth:`release`,
    :meth:`arm`); any other (``str(x)``'s ``__repr__``, ``__format__``'s ``item``) lets the
    timed one go on (:meth:`resume`). A read inside a timed call (``repr`` calling ``item``) is
    part of it. ``done(ns)`` is told of each timing's end: the read's nanoseconds, or None when
    it was not timed.
    """

    def __init__(self, done: Callable[[int | None], None],
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        """Args:
            done: told of each timed read's nanoseconds (None: not timed).
            clock: nanoseconds (``time.perf_counter_ns``; tests pass a fake).
        """
        self._done, self._clock = done, clock
        self._getter: CodeType | None = None
        self._codes: Collection[CodeType] = ()
        # True while torch's profiler runs: its Python tracer is a profile function too
        self.profiling: Callable[[], bool] = _never
        # True while a lookup inside a waiting read runs, the profile function removed (an
        # attribute, read by every lookup on the script's thread)
        self.paused = False
        self._state = self._waited = _IDLE  # _waited: what a pause keeps
        self._start = self._left = self._lasti = self._paused_ns = 0
        self._bound: Any = None
        self._frame: FrameType | None = None  # the script's frame, then the read's own
        # one object: what ``sys.getprofile()`` returns while the timer is installed
        self.profile: Callable[[FrameType, str, Any], None] = self._event

    def know(self, getter: CodeType, codes: Collection[CodeType],
             profiling: Callable[[], bool]) -> None:
        """Learn the lookup's code (``_Read.__get__``), the codes of torch's Python read methods
        and ``profiling()``: True while torch's profiler runs (its Python tracer is a profile
        function too, so no read is timed then)."""
        self._getter, self._codes, self.profiling = getter, codes, profiling

    def arm(self, bound: Any, frame: FrameType) -> bool:
        """Time the read whose method ``bound`` the script's ``frame`` looked up (once no
        other profile function is installed, ``profiling()`` is False and :meth:`release`
        ended the timing before). True: the caller installs :attr:`profile`
        (``sys.setprofile``) as its last act (False: it is installed)."""
        self._state, self._bound, self._frame, self._lasti = _GETTER, bound, frame, frame.f_lasti
        return sys.getprofile() is None

    def resume(self) -> bool:
        """The lookup that paused the timing is no new read: the waiting read goes on once it
        returns. True: the caller installs :attr:`profile` as its last act."""
        if self._state != _PAUSED or sys.getprofile() is not None:
            return False
        self._state, self.paused = _RESUMED, False
        return True

    def release(self) -> bool:
        """Another read is about to be timed: end this one's timing if it waits (its method not
        yet called: not timed; a read C called: timed to now, or to the pause), or if its
        profile function was taken away. False: none is timed by this timer (a read of its own
        times itself), it is a read inside this one, or another profile function replaced this
        timer's."""
        state = self._state
        if state == _IDLE:
            return False
        installed = sys.getprofile()
        if state == _PAUSED:
            if self._waited == _PY_READ and _running(self._frame):
                return False  # a read inside the Python read timed
            self._end(None if self._waited != _CALLED or self._looked_up() else self._paused_ns)
        elif installed is self.profile and state == _CALLED:
            self._end(None if self._looked_up() else self._clock() - self._start)
        elif installed is None:  # taken away (the script's own sys.setprofile(None))
            self._end(None)
        else:
            return False
        return True

    def synced(self) -> None:
        """CUDA warned of a sync on the script's thread. Torch emits the warning as its call
        returns, after the wait: a read being called ends its timing here, before the audit's
        own work on the warning."""
        if self._state in (_C_READ, _PY_READ) and sys.getprofile() is self.profile:
            self._stop(self._clock() - self._start)

    def _looked_up(self) -> bool:
        """True when the script's instruction looked the method up (it is called next)."""
        code = self._frame.f_code.co_code if self._frame is not None else b""
        return self._lasti < len(code) and code[self._lasti] in _LOOKUPS

    def _end(self, ns: int | None) -> None:
        self._state, self._bound, self._frame, self.paused = _IDLE, None, None, False
        self._done(ns)

    def _pause(self, waited: int) -> None:
        """A lookup starts while ``waited`` is the state: no events heard until it says what it
        is (:meth:`release` or :meth:`resume`)."""
        self._state, self._waited, self.paused = _PAUSED, waited, True
        if waited == _CALLED:
            self._paused_ns = self._clock() - self._start
        sys.setprofile(None)

    def _stop(self, ns: int | None) -> None:
        if sys.getprofile() is self.profile:
            sys.setprofile(None)
        self._state, self._bound, self._frame = _IDLE, None, None
        self._done(ns)

    def _event(self, frame: FrameType, event: str, arg: Any) -> None:
        """The profile function: each event of the script's thread while a read is timed."""
        state = self._state
        if state == _C_READ:
            if arg is self._bound and (event == "c_return" or event == "c_exception"):
                self._stop(self._clock() - self._start)
        elif state == _PY_READ:
            if frame is self._frame and event == "return":
                self._stop(self._clock() - self._start)
            elif event == "call" and frame.f_code is self._getter:
                self._pause(_PY_READ)  # a lookup inside the read (__format__'s item)
        elif state == _GETTER:
            if event == "return" and frame.f_code is self._getter:
                self._state, self._left, self._start = _CALLED, _ARGUMENT_EVENTS, self._clock()
        elif state == _CALLED:
            if event == "c_call" and arg is self._bound:
                self._state, self._start = _C_READ, self._clock()
            elif event == "call" and frame.f_back is self._frame and frame.f_code in self._codes:
                self._state, self._frame, self._start = _PY_READ, frame, self._clock()
            elif event == "call" and frame.f_code is self._getter:
                self._pause(_CALLED)  # a new read, or one inside this one: it says which
            elif not self._looked_up():
                self._stop(self._clock() - self._start)  # the read C called has returned
            elif event == "return" and frame is self._frame:
                self._stop(None)  # looked up, never called
            else:
                self._left -= 1
                if self._left <= 0:
                    self._stop(None)
        elif state == _RESUMED:
            if event == "return" and frame.f_code is self._getter:
                self._state = self._waited
        else:
            sys.setprofile(None)  # idle: not this timer's to keep


def _never() -> bool:
    return False


def _running(frame: FrameType | None) -> bool:
    """True when ``frame`` is on the calling thread's stack (it has not returned)."""
    here: FrameType | None = sys._getframe(1)
    while here is not None:
        if here is frame:
            return True
        here = here.f_back
    return False
