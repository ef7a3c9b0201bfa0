"""torchrun's SIGTERM on a rank of a job: the script ends by ``SystemExit``, and the job's report
is made before the process dies."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["Terminated"]

# seconds rank 0 still waits for the other ranks' reports once SIGTERM came (torchrun kills
# 30 s after it): theirs are posted as their own scripts end
GRACE_S = 5.0


class Terminated:
    """SIGTERM, where the script leaves it at its default (death) and this is the main thread:
    torchrun sends it to every rank once one rank has failed. While the script runs, it raises
    ``SystemExit(143)`` there (128 + SIGTERM: the script ends as by ``sys.exit``, and the report
    says so); once :attr:`reporting`, it is only noted. :meth:`close` puts the default back and,
    where SIGTERM came, sends it again: the process then dies by it, as it would have.

    Args:
        clock: seconds (``time.monotonic``), for :meth:`over`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.reporting = False
        # when SIGTERM came (None: not yet)
        self.heard: float | None = None
        self._installed = False

    def install(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, self.handle)
                self._installed = True
        except ValueError:  # not the main thread
            pass

    def handle(self, signum: int, frame: FrameType | None) -> Any:
        if self.heard is None:
            self.heard = self.clock()
        if not self.reporting:
            raise SystemExit(128 + signum)

    def over(self) -> bool:
        """Whether the waits for the other ranks are over: SIGTERM came :data:`GRACE_S` ago."""
        return self.heard is not None and self.clock() - self.heard >= GRACE_S

    def close(self) -> None:
        if self._installed and signal.getsignal(signal.SIGTERM) == self.handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self.heard is not None:
                os.kill(os.getpid(), signal.SIGTERM)
