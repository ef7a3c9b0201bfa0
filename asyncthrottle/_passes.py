"""A throttle's loops: the wrapped pass running now, a step loop's open step, and the error a
pass's end left for later."""

from __future__ import annotations

import traceback
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .throttle import Throttle
    from .view import Pass


class StepBlock:
    """``with throttle.step():`` -- enter is ``Throttle.begin_step()``, exit ``end_step()`` (failed
    when the block raised)."""

    __slots__ = ("_throttle",)

    def __init__(self, throttle: Throttle) -> None:
        self._throttle = throttle

    def __enter__(self) -> int:
        return self._throttle.begin_step()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._throttle.end_step(failed=exc_type is not None)


class Passes:
    """The wrapped pass that runs a throttle now, and the error a pass's finalizer could not raise.

    The pass is held weakly: a ``break`` drops it, and the throttle then runs no pass. One pass
    runs at a time; a new one in the same thread ends the one before (:meth:`start`).

    Attributes:
        kept: an error of a pass's end that no caller could be given, for the throttle's next call
            that changes it (:meth:`raise_kept`); None when there is none.
        in_step: a step loop's step is open (``begin_step()`` was called and ``end_step()`` not
            yet).
    """

    __slots__ = ("_ref", "in_step", "kept")

    def __init__(self) -> None:
        self._ref: weakref.ref[Pass[Any]] | None = None
        self.kept: Exception | None = None
        self.in_step = False

    def running(self) -> Pass[Any] | None:
        """The pass running now, or None."""
        return self._ref() if self._ref is not None else None

    def step_open(self) -> bool:
        """A step is being run: a step loop's (:attr:`in_step`), or a running pass handed out a
        batch whose step is not recorded yet (its loop body runs)."""
        if self.in_step:
            return True
        running = self.running()
        return running is not None and running.in_body

    def start(self, new: Pass[Any]) -> None:
        """``new`` runs now: a kept error is raised first; a step loop's open step refuses it; an
        earlier pass left without ``close()`` is ended (asked for more, it raises).

        An error of the earlier pass's step delivery is raised here, and ``new`` does not start.
        """
        if self.kept is not None:
            self.raise_kept()
        if self.in_step:
            raise RuntimeError("cannot start a wrapped loop inside `with throttle.step():` "
                               "(or begin_step())")
        earlier = self.running()
        if earlier is not None:
            earlier.supersede("superseded")
        self._ref = weakref.ref(new)

    def close(self) -> None:
        """The throttle closes: the running pass (if any) ends as leaving it would (its step
        recorded); asked for more, it raises."""
        running = self.running()
        if running is not None:
            running.supersede("closed")

    def ends(self, finished: Pass[Any]) -> bool:
        """``finished`` has ended: True if it was the running pass (or the running one is gone),
        which no longer runs."""
        if self._ref is None or self._ref() not in (finished, None):
            return False
        self._ref = None
        return True

    def keep(self, error: Exception) -> None:
        """An error of a pass's end that no caller could be given (its finalizer ended it, after a
        ``break`` or in the GC): the next call that changes the throttle raises it, once.

        The traceback keeps its lines, not its frames' variables (the pass, its batches), which
        would stay alive with it.
        """
        traceback.clear_frames(error.__traceback__)
        if self.kept is None:
            self.kept = error

    def raise_kept(self) -> None:
        """Raise the kept error, once (callers test :attr:`kept` first: no call while none)."""
        kept, self.kept = self.kept, None
        try:
            raise kept  # type: ignore[misc]
        finally:
            # (no cycle through this frame)
            del kept

    def refuse(self, what: str) -> None:
        """``RuntimeError`` while a pass runs: ``what`` (a step loop's call) cannot mix with it."""
        # (running(), inlined: every begin_step() of a step loop)
        ref = self._ref
        if ref is not None and ref() is not None:
            raise RuntimeError(
                f"{what} was called inside a wrapped loop over this Throttle; the wrapper already "
                "records and waits for each step -- use one or the other"
            )
