"""Hugging Face transformers integration: a TrainerCallback that throttles ``Trainer.train`` and delivers the loss."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError(
        "asyncthrottle.transformers needs transformers: pip install 'asyncthrottle[transformers]'"
    ) from None

from .hooks import ThrottleHooks
from .throttle import Throttle

__all__ = ["ThrottleCallback", "transformers_advice"]


class ThrottleCallback(ThrottleHooks, TrainerCallback):  # type: ignore[misc]
    """Throttles ``transformers.Trainer.train``: at most ``depth`` optimizer steps unfinished on the device.

    One step is one optimizer step, gradient accumulation included: the host
    waits for room in ``on_step_begin`` (before the first micro-batch) and
    the step's event is recorded in ``on_step_end`` (after the optimizer
    step). Each step's loss -- the mean of the losses the model returned for
    its micro-batches (``outputs["loss"]``, seen by a forward hook on the
    model while it trains) -- is deferred as ``"loss"`` without a sync and
    reaches ``callback.throttle.on_complete`` and ``.latest``. Models that
    return a tuple, or no loss, deliver none. The callback drains before an
    evaluation or a save it is told of (``control.should_evaluate`` /
    ``should_save``), at the end of each epoch, on evaluate, on save and at
    the end of training. A step left open by an exception is dropped at the
    next ``train()``, without blocking. It warns once
    (:class:`~asyncthrottle.syncaudit.SyncAdvice`) about settings that sync
    every step, see :func:`transformers_advice`.

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
    _TRANSIENT = ("_handle", "_losses")

    def __init__(self, depth: int | None = 2, **throttle_options: Any) -> None:
        super().__init__(depth, **throttle_options)
        self._handle: Any = None  # the forward hook on the model
        self._losses: list[Any] = []  # this step's micro-batch losses, on the device
        self._thread: int | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._losses = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.fail()  # a step left open by an earlier train() that raised
        self._losses = []
        self._thread = threading.get_ident()
        for key, message in transformers_advice(args):
            self.advise(key, message)
        if self._handle is not None:
            self._handle.remove()
        self._handle = model.register_forward_hook(self._capture) if isinstance(model, torch.nn.Module) else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._losses = []
        self.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        losses, self._losses = self._losses, []
        loss = None
        if len(losses) == 1:
            loss = losses[0]
        elif losses:
            loss = torch.stack([value.float() for value in losses]).mean()  # enqueued on the device: no sync
        self.end(loss)
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

    def _capture(self, module: Any, inputs: Any, output: Any) -> None:
        """The model's forward hook: keep the micro-batch's loss tensor (detached; no sync)."""
        if not (self.step_open and module.training and threading.get_ident() == self._thread):
            return
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())


def transformers_advice(args: Any) -> list[tuple[str, str]]:
    """The ``TrainingArguments`` that sync every step, each with how to avoid it.

    ``logging_nan_inf_filter=True`` (the default) evaluates
    ``torch.isnan(loss) or torch.isinf(loss)`` on the host every micro-batch;
    ``include_num_input_tokens_seen`` gathers a token count and ``.item()``-s
    it every micro-batch.
    """
    advice = []
    if getattr(args, "logging_nan_inf_filter", False):
        advice.append(("nan_inf_filter", "TrainingArguments(logging_nan_inf_filter=True), the default, runs "
                       "`torch.isnan(loss) or torch.isinf(loss)` on the host every micro-batch: two host-device "
                       "syncs per micro-batch that make the throttle moot. Pass logging_nan_inf_filter=False (a "
                       "NaN/Inf loss then shows in the logged loss instead of being skipped)"))
    tokens = getattr(args, "include_num_input_tokens_seen", "no")
    if tokens not in ("no", False, None):
        advice.append(("tokens_seen", f"TrainingArguments(include_num_input_tokens_seen={tokens!r}) gathers the token "
                       "count and calls .item() on it every micro-batch (a host-device sync): pass "
                       "include_num_input_tokens_seen='no', or count tokens on the host from the batches' shapes"))
    return advice
