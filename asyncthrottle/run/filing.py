"""Where the sync audit files the reads the runner hears: in the open step, held for a step that
may come (a batch taken, a forward elsewhere: the step then claims them), or outside steps (a
suspended step's, an evaluation's). A base of :class:`~asyncthrottle.run.steps.Steps`, which holds
the state (declared here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Filing"]


class Filing:
    """The filing calls of :class:`~asyncthrottle.run.steps.Steps`."""

    sites: Any
    open: bool
    holding: str | None
    suspended: float | None
    tail_marked: bool
    clock: Callable[[], float]

    def _suspend(self) -> None:
        """A forward elsewhere after the batch's update: an evaluation with grad on (the step
        then ended here: see ``Steps._close``) or another model's update in the same batch (a
        WGAN's generator: :meth:`_resume`); until a ``backward()`` says which, its reads are
        outside steps and its time is not the step's."""
        if self.suspended is None:
            self.suspended = self.clock()
            if self.sites is not None:
                self.sites.in_step = False

    def _resume(self) -> None:
        """The suspended step trains again (a ``backward()``, an optimizer step): it goes on."""
        self.suspended, self.tail_marked = None, False
        if self.sites is not None:
            self.sites.in_step = True

    def _hold(self, why: str) -> None:
        """File the reads from now in steps, provisionally: the batch the loop took (or a
        forward) may start a step, which then claims them; else they go outside steps."""
        if self.sites is not None and not self.open:
            if not self.holding:
                self.sites.in_step = True
            self.holding = why

    def _unhold(self) -> None:
        """The held reads belong to no step: outside steps."""
        if self.holding:
            self.holding = None
            if self.sites is not None:
                self.sites.discard_step()
                self.sites.in_step = False
