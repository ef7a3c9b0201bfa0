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
        # each position by its optimizer's class and parameters (see position())
        self._kinds: dict[tuple[type, tuple[int, ...]], int] = {}
        # the optimizer steps running, by the frame that runs each (an exception leaves one);
        # empty, running() is not called (a call less, every step)
        self.frames: list[FrameType] = []
        # whether the optimizers step where no hook hears them (a step torch.compile runs calls
        # none): None until a step tells; False once an optimizer step is heard, True once
        # their parameters moved with none heard (see moved())
        self.unheard: bool | None = None
        # versions() as the open step began, while steps may be unheard
        self.stamp = 0

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

    def position(self, optimizer: Any, source: Any, step: int) -> int:
        """``optimizer``'s position (in the order of first steps); the first time, its name
        (``"optimizer 0 (Adam)"``) is told to ``source`` (:meth:`Source.named`), with the
        ``step`` it first steps in.

        An optimizer of the class of one before it, over the same parameters, takes that one's
        place: a script that makes its optimizer anew each epoch (to reset its state or its
        learning rate) has one optimizer's losses, not one series an epoch. (Looked at once an
        optimizer, at its first step.)"""
        position = self.positions.get(id(optimizer))
        if position is None:
            kind = (type(optimizer), tuple(id(param) for group in optimizer.param_groups
                                           for param in group["params"]))
            position = self._kinds.get(kind)
            if position is None:
                position = self._kinds[kind] = len(self._kinds)
                source.named(f"optimizer {position} ({type(optimizer).__name__})", step)
            self.positions[id(optimizer)] = position
        return position

    def moved(self) -> bool:
        """Whether the optimizers stepped where no hook heard them (``torch.compile`` ran the
        step) since :attr:`stamp` was taken: their parameters changed in place. Then their
        steps are unheard from now on (asked only until an optimizer step is heard)."""
        if self.versions() == self.stamp:
            return False
        self.unheard = True
        return True

    def versions(self) -> int:
        """The sum of the version counters of each optimizer's first trainable parameter of
        each group: an update changes its parameters in place, which raises the counter (a
        compiled optimizer step too, where no hook runs); a forward or ``backward()`` does not.
        (A call a step only while no optimizer step was heard: see ``unheard``.)"""
        total = 0
        for optimizer in list(self._made):
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if getattr(param, "requires_grad", False):
                        # (a tensor without a counter, a subclass's: never seen to move)
                        total += getattr(param, "_version", 0)
                        break
        return total

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
