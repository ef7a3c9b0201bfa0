"""Finding a script's training steps from what it calls: forwards, backwards, optimizer steps and
its loader's batches."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..framework import ThrottleHooks

__all__ = ["Source", "Steps"]


class Source:
    """One throttle the runner reads: the runner's own, or a framework's callback; each step's
    delivered loss by the throttle's step number (the host copies, read only at the report)."""

    def __init__(self, hooks: ThrottleHooks, framework: str | None = None) -> None:
        self.hooks = hooks
        self.framework = framework
        self.losses: dict[int, Any] = {}
        hooks.throttle.on_complete(self._delivered)

    def _delivered(self, step: int, values: dict[str, Any]) -> None:
        # no float() here: this runs under the script's frames, where a read would be the script's
        self.losses[step] = values.get("loss")


class Steps:
    """The state of the script's training, told by the hooks of :mod:`asyncthrottle.run.torchhooks`.

    A step opens at the first training forward (grad enabled) or backward after the last step
    was done, and is done once an optimizer (or ``GradScaler``) has stepped -- with no optimizer
    in the script, once it has called ``backward()``. A done step stays open (its tail: logging,
    ``loss.item()``) until the loop asks its loader for the next batch, a new step begins, an
    evaluation starts (``model.eval()``, a forward without grad) or the script ends. Its loss is the
    sum of the values its ``backward()`` calls were given, unscaled when a ``GradScaler`` scaled
    them (inside ``optimizer.step(closure)``: the first closure's). Only the loop's thread counts.

    Args:
        make: builds the runner's :class:`ThrottleHooks` at the first step (after the script has
            set up its device and process group).
        sites: the sync audit (``in_step`` is set here), or None.
        collective: the backward holds a collective (DDP's all-reduce): its section is left out
            of the rank's own work, so the straggler is named by its own phases.
    """

    def __init__(self, make: Callable[[], ThrottleHooks], sites: Any = None, *,
                 collective: bool = False) -> None:
        self._make = make
        self.sites = sites
        self.collective = collective
        self.sources: list[Source] = []
        self.runner: Source | None = None
        self.thread = threading.main_thread().ident
        # an optimizer was made: without one, each backward() is a step (manual SGD)
        self.optimizers = False
        # >0 inside Trainer.fit/train: the framework's callback finds the steps there
        self.framework = 0
        # an error of the runner's own (the hooks then stand aside; the report says so)
        self.error: Exception | None = None
        self.open = False
        self.paused = True
        self.input_wait = 0.0
        self.loader: dict[str, Any] | None = None
        self._fetched: dict[str, Any] | None = None
        # sync counts at the start of the open step's tail (reads after its last one are not
        # a step's when no step follows)
        # the audit's counts when the last step was done (its tail: the reads after it)
        self.tail_counts: dict[Any, int] | None = None
        self.tail_reads: list[dict[str, Any]] = []
        self.arm: Callable[[], None] = _nothing
        self.disarm: Callable[[], None] = _nothing
        # GradScaler.scale's outputs (by id) and what they scaled: taken by the backward() of one
        self.scaled: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self._reset()

    def _reset(self) -> None:
        self.backwards = 0
        self.updated = False
        self.in_optimizer = 0
        self.stepped: set[int] = set()
        self.loss: Any = None
        self.inner_loss: Any = None
        self.lossless = False

    # -- what the hooks tell --------------------------------------------------

    def forward(self, grad: bool) -> None:
        """A module's forward begins (armed only while the next one may open or end a step)."""
        if self.in_optimizer:
            return
        if not grad:
            # evaluation, unless the step is still before its update (a teacher's forward)
            self.leave()
            return
        self._enter()
        assert self.runner is not None
        self.runner.hooks.phase("forward")
        self.disarm()

    def backward(self, tensors: Any) -> None:
        """``backward()`` is called on ``tensors`` (before autograd runs)."""
        if self.in_optimizer:
            # a closure evaluated by optimizer.step(closure) (LBFGS): its first loss is the step's
            if self.inner_loss is None:
                self.inner_loss = self._unscaled(tensors)
            return
        self._enter()
        assert self.runner is not None
        self.runner.hooks.phase("backward", collective=self.collective)
        value = self._unscaled(tensors)
        if value is None:
            self.lossless = True
        else:
            self.loss = value if self.loss is None else self.loss + value
        self.backwards += 1

    def after_backward(self) -> None:
        self.arm()
        if not self.optimizers:
            self._tail_starts()

    def optimizer_begin(self, optimizer: object) -> None:
        """An optimizer (or a ``GradScaler``) steps: the step's update."""
        if self.in_optimizer:
            # optimizer.step() inside GradScaler.step()
            self.in_optimizer += 1
            return
        # the same optimizer again (LBFGS's step after step): a new step; another one, the same
        if self.open and id(optimizer) in self.stepped:
            self._close()
        if not self.open:
            self._open()
        self.in_optimizer = 1
        self.stepped.add(id(optimizer))
        assert self.runner is not None
        self.runner.hooks.phase("optimizer")

    def optimizer_end(self) -> None:
        self.in_optimizer -= 1
        if self.in_optimizer or not self.open:
            return
        self.updated = True
        assert self.runner is not None
        self.runner.hooks.end_phase()
        self.arm()
        self._tail_starts()

    def scale(self, scaled: Any, original: Any) -> None:
        """``GradScaler.scale(original)`` returned ``scaled``."""
        pairs = (zip(scaled, original, strict=False) if isinstance(scaled, (list, tuple))
                 else [(scaled, original)])
        if len(self.scaled) > 64:
            # outputs scaled and never given to backward()
            self.scaled.clear()
        for big, small in pairs:
            if big is not small:
                self.scaled[id(big)] = (weakref.ref(big), small)

    def fetch_begin(self) -> None:
        """The loop asks a DataLoader for a batch: a done step's body has ended."""
        if self.open and self._done():
            self._close()

    def fetch_end(self, seconds: float, stopped: bool, loader: dict[str, Any] | None) -> None:
        if not self.paused:
            self.input_wait += seconds
        self._fetched = loader
        if stopped:
            self.leave()

    def leave(self) -> None:
        """Training stops for now (an evaluation, an epoch's end): a done step ends, and the time
        until the next step is not the loop's."""
        if self.open and self._done():
            self._close()
        if not self.open and not self.paused and self.runner is not None:
            self.runner.hooks.throttle.pause()
            self.paused = True

    # -- frameworks -----------------------------------------------------------

    def framework_begin(self) -> None:
        self.leave()
        self.framework += 1
        self.disarm()

    def framework_end(self, source: Source | None) -> None:
        self.framework -= 1
        if source is not None and source not in self.sources:
            self.sources.append(source)
        self.arm()

    # -- the step's life ------------------------------------------------------

    def _done(self) -> bool:
        return self.updated or (not self.optimizers and self.backwards > 0)

    def _enter(self) -> None:
        if self.open and self._done():
            self._close()
        if not self.open:
            self._open()

    def _open(self) -> None:
        if self.runner is None:
            self.runner = Source(self._make())
            self.sources.append(self.runner)
        self.runner.hooks.begin()
        self._reset()
        self.open, self.paused = True, False
        self.tail_counts = None
        self.loader = self._fetched or self.loader
        if self.sites is not None:
            self.sites.in_step = True

    def _close(self) -> None:
        assert self.runner is not None
        hooks = self.runner.hooks
        self.open = False
        if self.sites is not None:
            self.sites.in_step = False
        if self._done():
            loss = self.loss if self.loss is not None else self.inner_loss
            hooks.end(None if self.lossless else loss)
        else:
            # a forward with grad that trained nothing: no step
            hooks.fail()

    def _tail_starts(self) -> None:
        if self.sites is not None:
            # a dict copy each step, not rows(): no sort, no formatting per step
            self.tail_counts = self.sites.counts()

    def _unscaled(self, tensors: Any) -> Any:
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                return None
            tensors = tensors[0]
        kept = self.scaled.pop(id(tensors), None)
        if kept is not None and kept[0]() is tensors:
            tensors = kept[1]
        numel = getattr(tensors, "numel", None)
        if numel is None or numel() != 1:
            return None
        return tensors.detach()

    def finish(self) -> None:
        """The script ended: end the open step (the reads of a done step's tail are outside steps:
        no step followed) and deliver every step's values."""
        if self.open:
            if self._done() and self.tail_counts is not None and self.sites is not None:
                self.tail_reads = self.sites.rows(1, since=self.tail_counts)
            self._close()
        for source in self.sources:
            source.hooks.drain()


def _nothing() -> None:
    pass
