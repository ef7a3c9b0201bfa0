"""Lightning integration: a callback that throttles ``Trainer.fit`` and a progress bar that never
syncs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, TQDMProgressBar
    from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics
except ImportError as exc:
    # ModuleNotFoundError: pytest.importorskip skips on it, and it names what is missing
    raise ModuleNotFoundError("asyncthrottle.lightning needs Lightning: pip install "
                              f"'asyncthrottle[lightning]' ({exc})",
                              name=exc.name or "lightning") from exc

from . import _lightning_sigterm as sigterm
from ._options import check_int
from ._progress import postfix
from .framework import ThrottleHooks
from .throttle import Throttle

__all__ = ["ThrottleCallback", "ThrottleProgressBar", "lightning_advice"]

_LIGHTNING_VERSION: str = getattr(pl, "__version__", "0")
# Lightning versions from which DDP .item()s a SIGTERM flag every step
_SIGTERM_BROADCAST = (2, 5, 2)


class ThrottleCallback(ThrottleHooks, Callback):
    """Throttles ``lightning.Trainer.fit``: at most ``depth`` training steps unfinished on the
    device.

    One step is one training batch: one ``training_step`` call, from
    ``on_train_batch_start`` (the host waits there for room) to
    ``on_train_batch_end`` (the step's event is recorded after the optimizer
    step). That holds for gradient accumulation (each micro-batch is a step),
    manual optimization and several optimizers (however many
    ``optimizer.step()`` calls a ``training_step`` makes, it is one step).

    Each step's loss, as ``training_step`` returned it (its ``"loss"``, or
    the tensor itself), is deferred as ``"loss"`` without a sync: read it in
    :meth:`~asyncthrottle.framework.ThrottleHooks.on_complete` or
    ``callback.throttle.latest``. Its step numbers are the batch's index over
    the whole fit, across epochs (``trainer.fit_loop.total_batch_idx``), and
    go on from a checkpoint's under ``fit(ckpt_path=...)``: without gradient
    accumulation, the step of the batch's ``self.log`` values (see
    :meth:`~asyncthrottle.framework.ThrottleHooks.framework_step`). Under
    ``accumulate_grad_batches=k`` it is that loss too (what ``self.log``
    logs), not Lightning's ``outputs["loss"]``, which is divided by ``k``.
    A NaN/Inf loss is reported from that host copy, without a sync
    (``nonfinite=``, default ``"warn"``; ``"raise"`` stops ``fit`` from the
    next batch hook, within ``depth`` steps).
    The callback drains before validation, at the end of each training epoch,
    before a checkpoint is saved (``save_weights_only=True`` too: it drains
    when the module's ``state_dict()`` is taken on the loop's thread) and at
    the end of training; a drain from inside a step (``save_checkpoint()`` in
    ``training_step``) waits only for the steps before it. On an exception it
    drops the open step, ends the pass (the time until the next ``fit()`` is
    not loop time) and blocks on nothing. A batch skipped by
    ``on_train_batch_start`` returning -1 is no step. Whenever Lightning
    logs the training step's metrics (every ``trainer.log_every_n_steps``
    optimizer steps) it logs ``throttle.stats`` (plain floats, keys
    ``asyncthrottle/<field>``) to the trainer's loggers, on Lightning's own
    step axis. It warns
    once (:class:`~asyncthrottle.syncaudit.SyncAdvice`, at the line that
    called ``fit``) about settings that sync every step, see
    :func:`lightning_advice`; on a synchronous throttle (the CPU) never.

    Example:
        >>> cb = ThrottleCallback(depth=2, device="cpu")
        >>> trainer = lightning.Trainer(callbacks=[cb, ThrottleProgressBar()])  # doctest: +SKIP
        >>> cb.throttle.depth, cb.throttle.stats.steps
        (2, 0)

    Each step's phases are :meth:`~asyncthrottle.Throttle.section` s:
    ``forward`` (batch start to ``on_before_backward``), ``backward`` (to
    ``on_after_backward``; ``collective`` under multi-process training, as it
    holds DDP's all-reduce) and ``optimizer`` (``on_before_optimizer_step``
    to the batch's end): ``stats.sections``, and under ``ranks_every`` the
    rank scores name a DDP straggler from them.

    Args:
        depth: steps allowed in flight (an int >= 1, or None to only track).
        sigterm_every: under multi-process training, Lightning 2.5.2 to 2.6.x
            broadcasts a SIGTERM flag and ``.item()`` s it every training
            batch (one sync per step). An int ``n >= 2`` exchanges it every
            ``n`` batches instead (``all_reduce``, one ``.item()``): a
            SIGTERM on any rank stops every rank at the same batch, up to
            ``n`` batches later (a SIGTERM in the last ``< n`` batches lets
            ``fit`` finish). 1 keeps Lightning's own broadcast, every batch,
            without the warning. None (default): Lightning's own, and a
            warning (on an asynchronous device). Other Lightning versions: a
            warning, Lightning's own. A wrong type raises ``TypeError``, an
            int below 1 ``ValueError``.
        **throttle_options: keyword options of :class:`~asyncthrottle.Throttle`
            (``device``, ``events``, ``wait``, ``clock``, ``detect_sync``, ...).

    ``.throttle`` is the :class:`~asyncthrottle.Throttle`, there from
    construction (register ``on_complete`` before ``fit``, on the callback for
    Lightning's step numbers, on ``.throttle`` for its own). The callback
    pickles (``strategy="ddp_spawn"``): see :class:`~asyncthrottle.framework.ThrottleHooks`.
    """

    throttle: Throttle
    _TRANSIENT = ("_state_hook", "_undo_sigterm")

    def __init__(self, depth: int | None = 2, *, sigterm_every: int | None = None,
                 **throttle_options: Any) -> None:
        check_int("sigterm_every", sigterm_every, minimum=1,
                  rule="an int >= 1 (exchange Lightning's DDP SIGTERM flag every that many "
                       "batches) or None",
                  fix="e.g. sigterm_every=50, or None for Lightning's own")
        super().__init__(depth, **throttle_options)
        self._sigterm_every = sigterm_every
        self._undo_sigterm: Any = None
        self._results_checked = False
        # the module's state_dict pre-hook: a drain before any checkpoint
        self._state_hook: Any = None
        self._thread: int | None = None

    # -- the steps -------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._remove_state_hook()
        # save_weights_only=True skips on_save_checkpoint, never the module's state_dict()
        if stage == "fit":
            module: _StateDictHooks = pl_module
            self._state_hook = module.register_state_dict_pre_hook(self._before_state_dict)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._remove_state_hook()
        self._restore_sigterm()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after a fit() that raised (on_exception ended its pass, unless it never ran)
        self.abandon(self._began)
        self._thread = threading.get_ident()
        self._results_checked = False
        self._restore_sigterm()
        every = getattr(self, "_sigterm_every", None)
        # after Lightning's signal handlers, before a batch
        if every is not None and sigterm.every_step(trainer):
            try:
                self._undo_sigterm = sigterm.install(trainer, every)
            except RuntimeError as exc:
                self.advise("sigterm_every", f"sigterm_every={every} left Lightning's per-step "
                            f"SIGTERM broadcast as it is: {exc}")
        for key, message in lightning_advice(trainer,
                                             sigterm_every=every if self._undo_sigterm else None):
            self.advise(key, message)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.begin(_batch_number(trainer))
        self.phase("forward")

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Any) -> None:
        # DDP: it holds the all-reduce
        self.phase("backward", collective=getattr(trainer, "world_size", 1) > 1)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.end_phase()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        self.phase("optimizer")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self.end(_loss(outputs, trainer))
        # what the first step logged tells whether each step will sync
        if not self._results_checked:
            self._results_checked = True
            for key, message in _logged_advice(trainer):
                self.advise(key, message)
        step = _logger_step(trainer)
        if step is not None:
            values = self.log_values()
            for logger in trainer.loggers:
                logger.log_metrics(values, step=step)

    # -- the drains ------------------------------------------------------------

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.drain()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_skipped()
        self.drain()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self.drain()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_skipped()
        self.drain()
        self._restore_sigterm()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        # never blocks: the device may be what failed
        self.abandon()
        self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        undo, self._undo_sigterm = getattr(self, "_undo_sigterm", None), None
        if undo is not None:
            undo()

    def _drop_skipped(self) -> None:
        """A step still open after the epoch's batches: ``on_train_batch_start`` returned -1, no
        training_step ran."""
        if self.step_open:
            self.fail()

    def _before_state_dict(self, module: Any, prefix: str, keep_vars: bool) -> None:
        # a checkpoint thread of the user's never touches the throttle
        if threading.get_ident() == self._thread:
            self.drain()

    def _remove_state_hook(self) -> None:
        if self._state_hook is not None:
            self._state_hook.remove()
            self._state_hook = None


class ThrottleProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar without its per-step sync: shows the throttle's postfix and latest loss.

    The default bar reads ``trainer.progress_bar_metrics`` at each refresh,
    which turns every ``self.log(..., prog_bar=True)`` tensor into a number
    (``.item()``, a host-device sync). This bar never reads them: its postfix
    is the :class:`ThrottleCallback`'s (``done``, ``inflight``, ``wait``,
    ``idle`` and the latest deferred values, e.g. ``loss``) and the logger's
    version. Add a :class:`ThrottleCallback` to the same trainer.
    """

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics: dict[str, Any] = dict(get_standard_metrics(trainer))
        callback = next((cb for cb in trainer.callbacks if isinstance(cb, ThrottleCallback)), None)  # type: ignore[attr-defined]
        if callback is None:
            metrics["asyncthrottle"] = "no ThrottleCallback"
            return metrics
        # never blocks or syncs
        for part in postfix(callback.throttle).split():
            name, _, value = part.partition("=")
            metrics[name] = value
        return metrics


class _StateDictHooks(Protocol):
    """``torch.nn.Module``'s state_dict pre-hooks (untyped in torch)."""

    def register_state_dict_pre_hook(self, hook: Callable[[Any, str, bool], None]) -> Any: ...


def _loss(outputs: Any, trainer: Any) -> Any:
    """The loss ``training_step`` returned, from the batch's outputs, or None; never syncs.

    Under automatic optimization Lightning hands ``on_train_batch_end`` the
    loss divided by ``accumulate_grad_batches`` (what ``backward`` sees); it
    is multiplied back, enqueued on the device.
    """
    if isinstance(outputs, torch.Tensor):
        loss = outputs
    elif isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
        loss = outputs["loss"]
    else:
        return None
    k = getattr(trainer, "accumulate_grad_batches", 1)
    if k != 1 and getattr(trainer.lightning_module, "automatic_optimization", False):
        return loss * k
    return loss


def _batch_number(trainer: Any) -> int | None:
    """The batch's index over the whole fit, across epochs and a resume from a checkpoint
    (``trainer.fit_loop.total_batch_idx``), or None from another Lightning version."""
    number = getattr(getattr(trainer, "fit_loop", None), "total_batch_idx", None)
    return number if isinstance(number, int) else None


def _logger_step(trainer: Any) -> int | None:
    """The logger step of this batch's training metrics, or None when Lightning logs none for it.

    Mirrors ``_LoggerConnector.update_train_step_metrics``: no log while
    gradients accumulate (automatic optimization), else every
    ``log_every_n_steps`` on ``fit_loop.epoch_loop._batches_that_stepped``,
    which Lightning advances after this hook.
    """
    if not trainer.loggers or not getattr(trainer, "log_every_n_steps", 0):
        return None
    try:
        if (trainer.fit_loop._should_accumulate()
                and trainer.lightning_module.automatic_optimization):
            return None
        if not trainer._logger_connector.should_update_logs:
            return None
        return int(trainer.fit_loop.epoch_loop._batches_that_stepped)
    except AttributeError:
        # another Lightning version's internals: Lightning's public step, at its cadence
        return trainer.global_step if trainer.global_step % trainer.log_every_n_steps == 0 else None


def lightning_advice(trainer: Any, *, sigterm_every: int | None = None) -> list[tuple[str, str]]:
    """The trainer's settings that sync every training step, each with how to avoid it.

    Checked from the trainer alone, so it works on any machine: a
    ``ThroughputMonitor`` (``torch.cuda.synchronize()`` every batch), the
    default progress bar with ``prog_bar`` metrics, and multi-process training
    on Lightning >= 2.5.2 (a SIGTERM flag broadcast and ``.item()``-ed every
    step). Metrics logged with ``prog_bar=True`` are found after the first
    step (the callback checks them then).
    """
    advice = []
    names = {type(cb).__name__ for cb in getattr(trainer, "callbacks", ())}
    if "ThroughputMonitor" in names:
        advice.append(("throughput_monitor", "Lightning's ThroughputMonitor calls "
                       "torch.cuda.synchronize() every batch, a host-device sync per step that "
                       "makes the throttle moot: remove it and read "
                       "callback.throttle.stats.steps_per_s (logged as asyncthrottle/steps_per_s) "
                       "instead"))
    if (sigterm_every is None and getattr(trainer, "world_size", 1) > 1
            and _version(_LIGHTNING_VERSION) >= _SIGTERM_BROADCAST):
        advice.append(("sigterm_broadcast", f"Lightning {_LIGHTNING_VERSION} broadcasts a SIGTERM "
                       "flag across ranks and calls .item() on it every training step under "
                       "multi-process training (_TrainingEpochLoop._broadcast_sigterm_tensor): a "
                       "tensor made on the device, a broadcast and a blocking .item() on every "
                       "rank, every batch -- one host-device sync per step, so the throttle has "
                       "nothing to bound (in effect depth 1). ThrottleCallback(..., "
                       "sigterm_every=N) exchanges it every N batches instead (a SIGTERM then "
                       "stops every rank up to N batches later); see asyncthrottle's "
                       "docs/frameworks.md (Lightning)"))
    return advice


def _logged_advice(trainer: Any) -> list[tuple[str, str]]:
    """Metrics logged with ``on_step=True, prog_bar=True`` in the first step: Lightning ``.item()``s
    each one."""
    results: Any = getattr(trainer, "_results", None)
    try:
        names = sorted(key for key,
                       metric in results.items() if metric.meta.prog_bar and metric.meta.on_step)
    except AttributeError:
        # no results yet, or another Lightning version's internals: nothing to say
        return []
    if not names:
        return []
    bar = trainer.progress_bar_callback
    default_bar = bar is not None and not isinstance(bar, ThrottleProgressBar)
    return [("prog_bar", f"self.log(..., prog_bar=True) on every step ({', '.join(names)}) makes "
             "Lightning call .item() on each value every batch, even with the bar disabled"
             + (", and the default progress bar reads them again" if default_bar else "")
             + ": log them with prog_bar=False (they still reach the loggers every "
             "log_every_n_steps) and use asyncthrottle.lightning.ThrottleProgressBar, which shows "
             "the deferred loss without a sync")]


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
