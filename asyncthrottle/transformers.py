"""Hugging Face transformers integration: a TrainerCallback that throttles ``Trainer.train`` and
delivers the loss."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as exc:
    # ModuleNotFoundError: pytest.importorskip skips on it, and it names what is missing
    raise ModuleNotFoundError("asyncthrottle.transformers needs transformers: pip install "
                              f"'asyncthrottle[transformers]' ({exc})",
                              name=exc.name or "transformers") from exc

from .backends.torch import copies_need_pinned_memory
from .framework import ThrottleHooks
from .throttle import Throttle

__all__ = ["ThrottleCallback", "step_loss", "transformers_advice"]


class ThrottleCallback(ThrottleHooks, TrainerCallback):  # type: ignore[misc]
    """Throttles ``transformers.Trainer.train``: at most ``depth`` optimizer steps unfinished on the
    device.

    One step is one optimizer step, gradient accumulation included: the host
    waits for room in ``on_step_begin`` (before the first micro-batch) and
    the step's event is recorded in ``on_step_end`` (after the optimizer
    step). Each step's loss, as the Trainer logs it, is deferred as
    ``"loss"`` without a sync and reaches
    :meth:`~asyncthrottle.framework.ThrottleHooks.on_complete`, with the step's
    ``state.global_step`` (1 for the first; a resume from a checkpoint goes
    on from its step), and ``callback.throttle.latest``: a forward hook on
    the model takes the loss it returns for each training micro-batch
    (``outputs["loss"]``), and the step's loss is their mean -- or their sum
    when the Trainer passed the model ``num_items_in_batch``, since each
    micro-batch's loss is then already normalized over the whole accumulated
    batch (see :func:`step_loss`).
    Models that return a tuple, or no loss (a ``compute_loss_func``, label
    smoothing), deliver none. A NaN/Inf step loss is reported (``nonfinite=``,
    default ``"warn"``; ``"raise"`` stops training from the next step hook)
    without a sync, so ``logging_nan_inf_filter=False`` loses nothing. The callback drains before an
    evaluation or a save it is told of (``control.should_evaluate`` / ``should_save``), at
    the end of each epoch, on evaluate, on save and at the end of training;
    an ``evaluate()`` or save from inside a step (a callback placed before
    this one) waits only for the steps before it, and the step still ends
    with its loss. A step left open by an exception is never recorded (an
    ``evaluate()`` after the failed ``train()`` does not record it) and is
    dropped at the next ``train()``, without blocking; the time in between
    is not loop time. It warns once
    (:class:`~asyncthrottle.syncaudit.SyncAdvice`, at the line that called
    ``train()``) about settings that sync every step, see
    :func:`transformers_advice`; on a synchronous throttle (the CPU) never.

    Example:
        >>> cb = ThrottleCallback(depth=2, device="cpu")
        >>> trainer = transformers.Trainer(model, args, callbacks=[cb])  # doctest: +SKIP
        >>> cb.throttle.depth, cb.throttle.latest
        (2, {})

    Args:
        depth: steps allowed in flight (an int >= 1, or None to only track).
        **throttle_options: keyword options of :class:`~asyncthrottle.Throttle`.

    ``.throttle`` is the :class:`~asyncthrottle.Throttle`, there from construction.
    """

    throttle: Throttle
    _TRANSIENT = ("_handle", "_losses", "_pre_handle")

    def __init__(self, depth: int | None = 2, **throttle_options: Any) -> None:
        super().__init__(depth, **throttle_options)
        # the forward hook on the model
        self._handle: Any = None
        # its forward pre-hook: the "forward" section's start
        self._pre_handle: Any = None
        # several processes: backward holds DDP's all-reduce
        self._collective = False
        # this step's micro-batch losses, on the device
        self._losses: list[Any] = []
        # the Trainer passed num_items_in_batch: each loss is over the whole step
        self._normalized = False
        # the Trainer multiplies such losses by this (average_tokens_across_devices)
        self._processes = 1
        self._thread: int | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._losses = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        # after a train() that raised: its pass ended when its last step began
        self.abandon(self._began)
        self._losses = []
        self._thread = threading.get_ident()
        self._processes = _loss_scale(args)
        for key, message in transformers_advice(args,
                                                nonfinite=self._options.get("nonfinite", "warn")):
            self.advise(key, message)
        if self._handle is not None:
            self._handle.remove()
        if self._pre_handle is not None:
            self._pre_handle.remove()
        self._handle = self._pre_handle = None
        self._collective = getattr(args, "world_size", 1) > 1
        if isinstance(model, torch.nn.Module):
            self._handle = model.register_forward_hook(self._capture, with_kwargs=True)
            self._pre_handle = model.register_forward_pre_hook(self._forward_begins)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._losses = []
        self._normalized = False
        # the global step this optimizer step makes (restored by resume_from_checkpoint)
        self.begin(state.global_step + 1)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.phase("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end_phase()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        losses, self._losses = self._losses, []
        self.end(step_loss(losses, normalized=self._normalized, processes=self._processes))
        if control.should_evaluate or control.should_save or control.should_training_stop:
            self.drain()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.drain()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.drain()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.drain()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.drain()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._pre_handle is not None:
            self._pre_handle.remove()
            self._pre_handle = None

    def _forward_begins(self, module: Any, args: Any) -> None:
        """The model's forward pre-hook: a training micro-batch's forward is a section."""
        if self.step_open and module.training and threading.get_ident() == self._thread:
            self.phase("forward")

    def _capture(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        """The model's forward hook: keep the micro-batch's loss tensor (detached; no sync)."""
        if not (self.step_open and module.training and threading.get_ident() == self._thread):
            return
        # what follows a micro-batch's forward
        self.phase("backward", collective=self._collective)
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
            self._normalized = kwargs.get("num_items_in_batch") is not None


def step_loss(losses: Sequence[Any], *, normalized: bool, processes: int = 1) -> Any:
    """An optimizer step's loss as the Trainer logs it, from the model's micro-batch losses; never
    syncs.

    The Trainer adds each micro-batch's training loss into the logged loss.
    A model that got ``num_items_in_batch`` (``normalized``) returns a loss
    already divided by the item count of the whole accumulated batch, which
    the Trainer multiplies by the number of processes when
    ``average_tokens_across_devices`` (``processes``): the step's loss is
    their sum. Any other loss is a per-micro-batch mean that the Trainer
    divides by the number of micro-batches: the step's loss is their mean.

    Args:
        losses: the micro-batch losses (device tensors), in order.
        normalized: whether the model was passed ``num_items_in_batch``.
        processes: the Trainer's factor on normalized losses (1 on one process).

    Returns:
        A 0-d tensor enqueued on the losses' device, or None for no losses.
    """
    if not losses:
        return None
    if len(losses) == 1 and not (normalized and processes != 1):
        return losses[0]
    # enqueued on the device: no sync
    stacked = torch.stack([value.float() for value in losses])
    return stacked.sum() * processes if normalized else stacked.mean()


def _loss_scale(args: Any) -> int:
    """What the Trainer multiplies a ``num_items_in_batch``-normalized loss by: the data-parallel
    processes."""
    if getattr(args, "average_tokens_across_devices", False):
        return max(1, int(getattr(args, "world_size", 1)))
    return 1


def transformers_advice(args: Any, *, nonfinite: str | None = "warn") -> list[tuple[str, str]]:
    """The ``TrainingArguments`` that sync every step, each with how to avoid it.

    ``logging_nan_inf_filter=True`` (the default) evaluates
    ``torch.isnan(loss) or torch.isinf(loss)`` on the host every micro-batch
    (with it off, the callback's check, its option ``nonfinite`` here, still
    reports a NaN/Inf step loss, without a sync);
    ``include_num_input_tokens_seen`` gathers a token count and ``.item()``-s
    it every micro-batch; on an accelerator with pinned memory, accelerate
    copies each micro-batch's tensors to the device blocking unless
    ``accelerator_config={"non_blocking": True}`` and
    ``dataloader_pin_memory=True``.
    """
    advice = _copy_advice(args)
    if getattr(args, "logging_nan_inf_filter", False):
        report = ("the callback still reports a NaN/Inf step loss (asyncthrottle.NonFiniteWarning, "
                  "stats.nonfinite; nonfinite='raise' stops training) from the loss it already "
                  "brings to the host, without that sync" if nonfinite is not None else
                  "a NaN/Inf loss then shows in the logged loss instead of being skipped; the "
                  "callback's nonfinite='warn' (its default, off here) would report it without a "
                  "sync")
        advice.append(("nan_inf_filter", "TrainingArguments(logging_nan_inf_filter=True), the "
                       "default, syncs the host with the device once per micro-batch to run "
                       "`torch.isnan(loss) or torch.isinf(loss)` (two bool() calls on device "
                       "tensors), which makes the throttle moot. Pass "
                       f"logging_nan_inf_filter=False: {report}"))
    tokens = getattr(args, "include_num_input_tokens_seen", "no")
    if tokens not in ("no", False, None):
        advice.append(("tokens_seen", f"TrainingArguments(include_num_input_tokens_seen={tokens!r})"
                       " gathers the token count and calls .item() on it every micro-batch (a "
                       "host-device sync): pass include_num_input_tokens_seen='no', or count "
                       "tokens on the host from the batches' shapes"))
    return advice


def _copy_advice(args: Any) -> list[tuple[str, str]]:
    """Blocking host-to-device copies of each micro-batch (accelerate's ``send_to_device``), on an
    accelerator."""
    device: Any = getattr(args, "device", None)
    non_blocking = bool(getattr(getattr(args, "accelerator_config", None), "non_blocking", False))
    pinned = bool(getattr(args, "dataloader_pin_memory", False))
    if not copies_need_pinned_memory(device) or (non_blocking and pinned):
        return []
    off = [name for name, on in (('accelerator_config={"non_blocking": True}', non_blocking),
                                 ("dataloader_pin_memory=True", pinned)) if not on]
    return [("blocking_copies", f"TrainingArguments without {' and '.join(off)}: accelerate copies "
             f"every tensor of every micro-batch to the {device.type} device blocking "
             "(send_to_device without non_blocking), a host-device sync per tensor. Pass "
             'accelerator_config={"non_blocking": True} and dataloader_pin_memory=True (the '
             "default): the copies then overlap the device's work")]
