"""The script's optimizers as the runner knows them: those it made, the ones a step steps (its
cycle), each one's position and name, and the optimizer steps running now."""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Any

__all__ = ["Optimizers"]


class Optimizers:
    """What a step needs to know of the script's optimizers.

    A step is complete once every optimizer of the cycle has stepped: before the first step is
    done, every optimizer the script made (a GAN's two); later, those the last done step stepped
    (an optimizer made but never used does not hold the steps open).
    """

    def __init__(self) -> None:
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()
        # an optimizer was made: without one, each backward() is a step (manual SGD)
        self.any = False
        # the optimizers (by id) the last done step stepped: the cycle of the next ones
        self.cycle: set[int] | None = None
        # each optimizer's position (by id), in the order of first steps
        self.positions: dict[int, int] = {}
        # the optimizer steps running, by the frame that runs each (an exception leaves one);
        # empty, running() is not called (a call less, every step)
        self.frames: list[FrameType] = []

    def made(self, optimizer: Any) -> None:
        """The script made ``optimizer``."""
        self.any = True
        self._made.add(optimizer)

    def complete(self, stepped: set[int]) -> bool:
        """Whether the optimizers ``stepped`` (by id) are the whole cycle."""
        expected = self.cycle
        if expected is None:
            expected = {id(optimizer) for optimizer in self._made}
        return expected <= stepped

    def learn(self, stepped: set[int]) -> None:
        """A done step stepped these optimizers: the cycle of the next ones."""
        self.cycle = set(stepped)

    def name(self, optimizer: Any) -> tuple[int, str | None]:
        """``optimizer``'s position (in the order of first steps) and, the first time, its name:
        ``"optimizer 0 (Adam)"``."""
        position = self.positions.get(id(optimizer))
        if position is not None:
            return position, None
        position = self.positions[id(optimizer)] = len(self.positions)
        return position, f"optimizer {position} ({type(optimizer).__name__})"

    # -- the steps running ----------------------------------------------------

    def enter(self, frame: FrameType) -> None:
        """An optimizer step run by ``frame`` begins."""
        self.frames.append(frame)

    def leave(self, frame: FrameType) -> bool:
        """The step ``frame`` ran has returned; False for an unpaired end (ignored)."""
        if not self.frames or self.frames[-1] is not frame:
            return False
        self.frames.pop()
        return True

    @property
    def nested(self) -> bool:
        """An optimizer step is still running after the one that just returned."""
        return bool(self.frames)

    def running(self) -> bool:
        """An optimizer step is running (its frame is on this thread's stack); forgets those an
        exception ended (a caught error in ``optimizer.step()``). Free when none runs."""
        frames = self.frames
        if not frames:
            return False
        alive = set()
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            alive.add(id(frame))
            frame = frame.f_back
        while frames and id(frames[-1]) not in alive:
            frames.pop()
        return bool(frames)
