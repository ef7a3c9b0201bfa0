"""Finding a script's training steps from what it calls: forwards, backwards, optimizer steps and
its loader's batches."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..framework import ThrottleHooks
from .beginnings import Beginnings
from .hearing import Hearing
from .losses import Losses
from .optimizers import Optimizers
from .source import Source, device_of

__all__ = ["SAMPLE_EVERY", "Source", "Steps"]

# the runner's throttle times every SAMPLE_EVERY-th step (sample_every=), and the runner enters
# the phases of those and of the first _ALL_TIMED steps (a short run's sections too)
SAMPLE_EVERY = 8
_ALL_TIMED = 16
# what the hooks saw, for a report that found no step: the keys of Steps.seen
SEEN = ("forwards", "backwards", "optimizer_steps", "autograd_grad", "other_threads", "processes")


class Steps(Hearing, Beginnings):
    """The state of the script's training, told by the hooks of :mod:`asyncthrottle.run.torchhooks`.

    A step is what the script does with one batch. It opens when its loader hands the loop a
    batch (once the loop has trained: the work before the first forward is the step's, not the
    loader's), else at the first training forward (grad enabled), ``backward()`` or optimizer step,
    or back at a forward without grad after the last update (a teacher's) once the step trains;
    it is done once every optimizer of the script's cycle has stepped (a GAN's two; the first
    step expects every optimizer the script made, later ones the set the last step stepped), or
    -- with no optimizer in the script -- once it has called ``backward()``. A done step stays open
    (its tail: logging, ``loss.item()``) until the loop asks its loader for the next batch, a new
    step begins, the same optimizer steps again, an evaluation starts (``model.eval()``, a forward
    without grad) or the script ends. A step that never trained (an evaluation batch, a batch
    whose optimizer step raised and was caught) is dropped, its reads are filed outside steps and
    its time is not the loop's. Its loss is the sum of what its ``backward()`` calls differentiate
    (a scalar; several at once, each times its ``grad_tensors`` weight: see ``Losses.value``),
    unscaled when a ``GradScaler`` scaled them (inside ``optimizer.step(closure)``: the first
    closure's); with several optimizers, each one's loss is the ``backward()`` calls before its
    step. Only the loop's thread counts.

    Args:
        make: builds the runner's :class:`ThrottleHooks` for a device (that of the first step's
            tensors, so that nothing initialises a device the script does not use).
        sites: the sync audit, or None.
        collective: the backward holds a collective (DDP's all-reduce): its section is left out
            of the rank's own work, so the straggler is named by its own phases.
        clock: the host clock of the loader's waits (the throttle's).
    """

    def __init__(self, make: Callable[[Any], ThrottleHooks], sites: Any = None, *,
                 collective: bool = False, clock: Callable[[], float] = time.perf_counter) -> None:
        self._make = make
        self.sites = sites
        self.collective = collective
        self.clock = clock
        self.sources: list[Source] = []
        self.runner: Source | None = None
        # the runner's device runs each step as it is issued (the CPU): a loss is read as its
        # backward() is called (a host read, where an accelerator would defer a copy)
        self.synchronous = False
        # the device of the runner's first step's tensors (None: none found, the throttle's own)
        self.device: Any = None
        self.thread = threading.main_thread().ident
        # the optimizers the script made (without one, each backward() is a step: manual SGD)
        self.optimizers = Optimizers()
        # a DataLoader fetches a batch on the loop's thread: what its dataset does is not heard
        self.loading = False
        # >0 inside Trainer.fit/train: the framework's callback finds the steps there
        self.framework = 0
        self.framework_source: Source | None = None
        # an error of the runner's own (the hooks then stand aside; the report says so)
        self.error: Exception | None = None
        # any of the three: the hooks hear nothing (kept by load(), stop_on() and the framework
        # calls, read by every hook)
        self.hushed = False
        self.open = False
        self.paused = True
        self.input_wait = 0.0
        self.loader: dict[str, Any] | None = None
        self._fetched: dict[str, Any] | None = None
        self.tail_reads: list[dict[str, Any]] = []
        self.seen = dict.fromkeys(SEEN, 0)
        self.arm: Callable[[], None] = _nothing
        self.disarm: Callable[[], None] = _nothing
        # the forward hook is in place (kept by arm() and disarm(): an armed hook is not armed
        # again, a call less)
        self.armed = False
        # the values backward() is called on, unscaled, as the step keeps them
        self.losses = Losses()
        # a backward() is running (kept by torchhooks' wrapper): one inside it is its own work
        self.backing = False
        # when a forward without grad came after a done step (see _quiet), or None
        self.quiet_at: float | None = None
        # where the trained steps' first forwards were called: a forward elsewhere opens no step
        # until it trains (see _elsewhere)
        self.openers: set[Any] = set()
        # the last of them (a site's hash hashes its code object's contents: compared first, a
        # loop's every step looks nothing up)
        self.opener: Any = None
        # a forward elsewhere was heard, and no step or pause followed yet (see _elsewhere)
        self.elsewhere = False
        self.last: Any = None
        # the sync audit files reads in a step that may not come (see _hold): what started
        # holding them, "batch" (a batch taken) or "forward" (a forward elsewhere), or None
        self.holding: str | None = None
        # the loop acts between steps (see read()): the forward hook stays armed until a
        # training forward opens the next step
        self.acting = False
        if sites is not None:
            sites.on_read = self.read
        self._reset()

    def _reset(self) -> None:
        self.backwards = 0
        self.updated = False
        self.stepped: set[int] = set()
        self.loss: Any = None
        self.inner_loss: Any = None
        self.lossless = False
        # the backward() values since the last optimizer step, and each optimizer's
        self.pending: Any = None
        self.each: dict[int, Any] = {}
        # anything of training heard in the open step (a step opened for a batch may stay empty)
        self.heard = False
        self.tail_marked = False
        self.opened_at = 0.0
        # the input wait of the batch that opened the step
        self.waited = 0.0
        # the throttle's number of the open step, and whether its phases are timed
        self.number = 0
        self.timed = True
        # the call site of the step's first forward
        self.first: Any = None
        # the step was opened by a DataLoader's batch (its next batch ends it), and when it was
        # suspended (see _suspend), or None
        self.batched = False
        self.suspended: float | None = None

    # -- what the hooks tell --------------------------------------------------

    def forward(self, grad: bool, module: Any, site: Any = None) -> None:
        """A module's forward begins, called from ``site`` (the script's code and line; armed
        only while the next one may open or end a step)."""
        if self.backing or (self.optimizers.frames and self.optimizers.running()):
            # (a block's forward run again by backward(): reentrant checkpointing)
            return
        if self.elsewhere and site != self.opener and site not in self.openers:
            # inside or after a forward elsewhere (see _elsewhere): nothing new until a forward
            # where the steps begin
            return
        if not grad:
            if self.acting:
                # (a rollout's forwards: the next training forward opens the step)
                return
            # an evaluation, or the next step's teacher (see _quiet); a teacher's forward inside a
            # step that has not trained yet stays (a batch with no training forward after it was
            # an evaluation's: see fetch_begin)
            if not self.open or self._done():
                self._quiet()
                self.disarm()
            else:
                self.heard = True
            return
        self.seen["forwards"] += 1
        self.last = site
        # a forward where this updated step's first one was: the next batch's (an optimizer made
        # but not stepped yet leaves the first step incomplete); with no loader, also where the
        # step before began (a WGAN's critic after the generator's update: a live step too many
        # is merged back by the report's grouping, one too few is not split)
        again = self.updated and (site == self.first or (
            site == self.opener and not self.batched))
        # (a step that has trained nothing yet is neither complete nor failed: no call to ask)
        if self.open and (self.updated or self.stepped or self.backwards) and (
                again or self._complete() or self._failed()):
            if self.batched and self.updated and not again:
                self._suspend()
                self.disarm()
                return
            self._close()
        if not self.open:
            if self.openers and site != self.opener and site not in self.openers:
                self._elsewhere()
                return
            if self.elsewhere:
                # the forwards since one elsewhere were an evaluation's (with grad on): not the
                # loop's time, and their reads are outside steps
                self._unhold()
                self._pause()
            self._open(module)
        if self.first is None:
            self.first = site
        self.heard = True
        if self.timed:
            self._phase("forward")
        self.disarm()

    def backward(self, tensors: Any, weights: Any = None) -> None:
        """``backward()`` is called on ``tensors`` (before autograd runs), with ``weights`` (its
        ``grad_tensors``: None for ones)."""
        if self.optimizers.frames and self.optimizers.running():
            # a closure evaluated by optimizer.step(closure) (LBFGS): its first loss is the step's
            if self.inner_loss is None:
                self.inner_loss = self.losses.value(tensors, weights)
            return
        self.seen["backwards"] += 1
        if not self.open or self.updated or self.stepped or self.backwards:
            self._enter(tensors)
        if self.first is None:
            # a step opened by its backward: its forward was the last one heard
            self.first = self.last
        self.heard = True
        if self.timed:
            self._phase("backward", collective=self.collective)
        value = self.losses.value(tensors, weights)
        if value is None:
            self.lossless = True
        else:
            self.loss = value if self.loss is None else self.loss + value
            self.pending = value if self.pending is None else self.pending + value
        self.backwards += 1

    def after_backward(self) -> None:
        if not self.armed:
            self.arm()
        if not self.optimizers.any and not self.tail_marked:
            self._mark_tail()

    def optimizer_begin(self, optimizer: Any, frame: FrameType) -> None:
        """An optimizer (or a ``GradScaler``) steps, run by ``frame``: the step's update."""
        if self.optimizers.frames and self.optimizers.running():
            # optimizer.step() inside GradScaler.step()
            self.optimizers.enter(frame)
            return
        self.seen["optimizer_steps"] += 1
        optimizers, key = self.optimizers, id(optimizer)
        optimizers.unheard = False
        # the same optimizer again (LBFGS's step after step): a new step; another one, the same
        if self.open and key in self.stepped:
            self._close()
        if not self.open:
            self._open(optimizer)
        optimizers.frames.append(frame)
        self.stepped.add(key)
        self.heard = True
        # the backward() values since the last optimizer step are this one's loss (a known
        # optimizer's position without a call: every step)
        position = optimizers.positions.get(key)
        if position is None:
            assert self.runner is not None  # (opened above)
            position = optimizers.position(optimizer, self.runner, self.number)
        if self.pending is not None:
            self.each[position], self.pending = self.pending, None
        if self.timed:
            self._phase("optimizer")

    def optimizer_end(self, frame: FrameType) -> None:
        """The optimizer step ``frame`` ran has returned (an unpaired end is ignored)."""
        # (Optimizers.leave and .nested, inlined: every step)
        frames = self.optimizers.frames
        if not frames or frames[-1] is not frame:
            return
        frames.pop()
        if frames or not self.open:
            return
        self.updated = True
        if self.timed:
            assert self.runner is not None
            self.runner.hooks.end_phase()
        if not self.armed:
            self.arm()
        # the tail is the reads after the step's last update (the step may be all the report's
        # step has: a WGAN's generator update, a live step of its own)
        if self.sites is not None:
            # (_mark_tail(), inlined: every step)
            self.sites.mark_tail()
            self.tail_marked = True

    def fetch_begin(self) -> None:
        """The loop asks a DataLoader for a batch: the step of the last one has ended. Until
        :meth:`fetch_end` (or ``load(False)``), the loader's work is not the script's."""
        # (load(True), inlined: every batch; first, so that the loader is hushed whatever follows)
        self.loading = self.hushed = True
        if self.sites is not None:
            self.sites.loading = True
        if self.holding:
            self._unhold()
        if self.elsewhere:
            # (the forward elsewhere trained nothing: an evaluation's)
            self._pause()
        # a batch that only ran forwards (an evaluation's) was no step; one that ran backward()
        # without an update is accumulating gradients: its step goes on
        forwards_only = self.heard and not self.backwards and not self.stepped
        if self.open and (self.updated or self._done() or forwards_only or self._failed()) and not (
                self.optimizers.frames and self.optimizers.running()):
            self._close()

    def fetch_end(self, start: float, seconds: float, stopped: bool,
                  loader: dict[str, Any] | None) -> None:
        """The loader's ``next()`` from ``start`` took ``seconds``; ``stopped``: it raised
        ``StopIteration`` (an epoch's end, its workers joined: not the loop's time)."""
        # (load(False), inlined: every batch; first, so that an error below leaves nothing hushed)
        self.loading = False
        self.hushed = bool(self.framework or self.error is not None)
        if self.sites is not None:
            self.sites.loading = False
        if stopped:
            self.stop(at=start)
            return
        self._fetched = loader
        if self.paused:
            # the next forward may start training again, and this batch's reads are its own
            self.arm()
            self._hold("batch")
            return
        self.input_wait += seconds
        if self.runner is not None and not self.open:
            self._open(None)
            self.batched = True
            # the loader's wait for a batch that may turn out to be no step's
            self.waited = seconds
            if not self.armed:
                self.arm()

    def leave(self) -> None:
        """An evaluation starts (``model.eval()``, a forward without grad): a done step ends, and
        the time until the next step is not the loop's."""
        if self.acting:
            self.acting = False
            self.disarm()
        self._unhold()
        if self.open and self._done():
            self._close()
        if not self.open:
            self._pause()

    def stop(self, at: float | None = None) -> None:
        """Training stops (an epoch's end at ``at``, a framework's ``fit()``): the open step ends,
        dropped if it never trained."""
        self._unhold()
        if self.open:
            self._close()
        self._pause(at)

    # -- the step's life ------------------------------------------------------

    def _done(self) -> bool:
        if not self.updated and self.backwards and not self.stepped and (
                self.optimizers.unheard is not False and self.optimizers.any):
            # an optimizer step no hook heard (compiled) updates the step all the same
            self.updated = self.optimizers.moved()
        return self.updated or (not self.optimizers.any and self.backwards > 0)

    def _complete(self) -> bool:
        """Done, and every optimizer of the cycle has stepped."""
        if not self.updated:
            return self._done()
        return self.optimizers.complete(self.stepped)

    def _failed(self) -> bool:
        """An optimizer step of the open step raised (and the script went on): no update."""
        return bool(self.stepped) and not self.updated

    def _enter(self, where: Any) -> None:
        if self.suspended is not None:
            self._resume()
            return
        if self.open and (self._complete() or self._failed()):
            self._close()
        if not self.open:
            self._open(where)

    def _open(self, where: Any) -> None:
        # the reads held since the batch was taken are this step's
        held, self.holding = self.holding, None
        self.elsewhere = False
        if self.runner is None:
            self.device = device_of(where)
            hooks = self._make(self.device)
            self.synchronous = hooks.throttle.synchronous
            self.losses.synchronous = self.synchronous
            self.runner = Source(hooks, direct=self.synchronous)
            self.sources.append(self.runner)
        # a step that trains after a quiet forward began there (see _quiet)
        began, self.quiet_at = self.quiet_at, None
        self.acting = False
        number = self.runner.hooks.begin(at=began)
        self._reset()
        self.number = number
        if self.optimizers.unheard is not False and self.optimizers.any:
            # (until an optimizer step is heard: a call a step where none is, as compiled)
            self.optimizers.stamp = self.optimizers.versions()
        # the phases of the first steps and of the sampled ones (the ones the throttle times on a
        # device): a section costs calls on every step it is entered
        self.timed = number < _ALL_TIMED or number % SAMPLE_EVERY == 0
        self.opened_at = self.clock() if began is None else began
        self.open, self.paused = True, False
        self.loader = self._fetched or self.loader
        if self.sites is not None and not held:
            self.sites.in_step = True

    def _close(self) -> None:
        assert self.runner is not None
        hooks = self.runner.hooks
        self.open = False
        if self.sites is not None:
            self.sites.in_step = False
        if not (self.updated or self._done()):
            # no step: a batch that trained nothing (an evaluation's, a caught error's)
            if self.sites is not None:
                self.sites.discard_step()
            self.input_wait -= self.waited
            hooks.fail()
            self._pause(self.opened_at)
            return
        if self.updated and self.stepped and self.stepped != self.optimizers.cycle:
            self.optimizers.learn(self.stepped)
        first = self.first
        if first is not None and first != self.opener:
            self.opener = first
            self.openers.add(first)
        loss = None if self.lossless else (
            self.loss if self.loss is not None else self.inner_loss)
        # a suspended step ended where it was suspended; the time after is not the loop's
        at = self.suspended
        seconds = (self.clock() if at is None else at) - self.opened_at
        self.ended(self.number, seconds, self.waited)
        if self.synchronous:
            # the step has run (the CPU): its values are on the host, no copy to wait for
            self.runner.keep(self.number, seconds, self.waited, loss, self.each)
            loss = None
        else:
            self.runner.times(self.number, seconds, self.waited)
            if len(self.runner.names) > 1:
                for position, value in self.each.items():
                    hooks.throttle.defer(value, name=f"loss:{position}")
        hooks.end(loss, at=at)
        if at is not None:
            self._pause(at)

    def ended(self, number: int, seconds: float, waited: float) -> None:
        """The live step ``number`` ended, ``seconds`` long, ``waited`` for its batch (a
        recording keeps it: :class:`~asyncthrottle.run.recording.RecordingSteps`)."""

    def _phase(self, name: str, *, collective: bool = False) -> None:
        assert self.runner is not None
        self.runner.hooks.phase(name, collective=collective)

    def _mark_tail(self) -> None:
        if self.sites is not None and not self.tail_marked:
            self.sites.mark_tail()
            self.tail_marked = True

    def finish(self) -> None:
        """The script ended: end the open step (the reads of a done step's tail are outside steps:
        no step followed) and deliver every step's values."""
        self._unhold()
        if self.open:
            if self._done() and self.tail_marked and self.sites is not None:
                self.tail_reads = self.sites.tail_rows()
            self._close()
        if self.quiet_at is not None:
            self._pause()
        for source in self.sources:
            source.hooks.drain()


def _nothing() -> None:
    pass
