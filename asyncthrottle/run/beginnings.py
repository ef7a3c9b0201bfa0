"""When a step began, where it is heard only as it trains: a forward without grad after the last
step (a teacher's, a target network's) or one with grad at another line (another task's), which
the step then began at; or an evaluation's, whose time the pause that follows reaches back to;
or a rollout's, whose host reads of its outputs pause the loop there.
A base of :class:`~asyncthrottle.run.steps.Steps`, which holds the state (declared here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .filing import Filing

__all__ = ["Beginnings"]


class Beginnings(Filing):
    """The reach-back calls of :class:`~asyncthrottle.run.steps.Steps`."""

    paused: bool
    open: bool
    armed: bool
    arm: Callable[[], None]
    # the loop acts between steps (see read())
    acting: bool
    # when the forward that may begin the next step came, or None
    quiet_at: float | None
    # that forward had grad, at another line than the steps' (see _elsewhere)
    elsewhere: bool
    runner: Any

    def _close(self) -> None:
        """End the open step (:meth:`Steps._close`)."""
        raise NotImplementedError

    def read(self, call: str, where: Any) -> None:
        """The script read a device value on the host (the sync audit's ``on_read``). After a
        forward without grad that ended the last step, not a teacher's: the loop acts between
        steps (a rollout reads its actions, an evaluation its scores). The time from that
        forward is not the loop's, and the forward hook stays armed until a training forward
        opens the next step there."""
        if self.quiet_at is not None and not self.open:
            self._pause()
            self.acting = True
            if not self.armed:
                self.arm()

    def _elsewhere(self) -> None:
        """A forward with grad where no step began yet, after the last step ended: an evaluation
        with grad on, or a step that trains from here (a loop alternating between two tasks'
        forwards, each at its own line). Its reads are held, and the hook stays armed (hearing
        the forward's own modules too, until one where the steps begin); a ``backward()`` first
        makes it a step that began here (:meth:`_quiet`'s reach-back), a forward where the steps
        begin first an evaluation, whose time is not the loop's."""
        self._hold("forward")
        self.elsewhere = True
        if not self.paused and self.quiet_at is None:
            self.quiet_at = self.clock()

    def _quiet(self) -> None:
        """A forward without grad once the step is done: an evaluation's (the time from here is not
        the loop's) or the next step's, before it trains (a teacher's or a target network's
        forward in a loop with no loader): the done step ends here; a pause (``model.eval()``,
        an epoch's end, the script's end) reaches back to here (:meth:`_pause`), and a step that
        opens first began here (:meth:`_open`)."""
        self._unhold()
        if self.open:
            self._close()
        if not self.paused and self.quiet_at is None:
            self.quiet_at = self.clock()

    def _pause(self, at: float | None = None) -> None:
        # (from the quiet forward that came first, if one did)
        quiet, self.quiet_at = self.quiet_at, None
        self.elsewhere = False
        if quiet is not None and (at is None or quiet < at):
            at = quiet
        if not self.paused and self.runner is not None:
            self.runner.hooks.throttle.pause(at)
            self.paused = True
