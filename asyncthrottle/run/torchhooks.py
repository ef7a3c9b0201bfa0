"""The runner's hooks in torch: what tells :class:`~asyncthrottle.run.steps.Steps` of a script's
forwards, backwards, optimizer steps, ``GradScaler`` calls, evaluations and DataLoader batches."""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from threading import get_ident
from typing import Any

from .patches import Patches
from .steps import Steps

__all__ = ["install"]


def install(steps: Steps, patches: Patches, clock: Callable[[], float] = time.perf_counter) -> None:
    """Hook torch for ``steps``: torch's global hooks where it has them (optimizer steps, module
    forwards), wrappers elsewhere (``torch.autograd.backward``, which ``Tensor.backward`` calls,
    ``GradScaler.scale``/``step``, ``Module.train``, ``Optimizer.__init__``, the DataLoader
    iterator's ``__next__``). Only the loop's thread, outside a framework's ``fit``/``train``,
    is heard; ``patches.undo()`` removes them all."""
    _forwards(steps, patches)
    _optimizers(steps, patches)
    _backward(steps, patches)
    _scaler(steps, patches)
    _loader(steps, patches, clock)


def _heard(steps: Steps) -> bool:
    return get_ident() == steps.thread and not steps.framework and steps.error is None


def _tell(steps: Steps, method: Callable[..., None], *args: Any) -> None:
    """Call ``method(*args)``; an error of the runner's never reaches the script: it stops the
    hooks, and the report says so."""
    try:
        method(*args)
    except Exception as exc:
        steps.error = exc


def _forwards(steps: Steps, patches: Patches) -> None:
    import torch
    from torch.nn.modules import module

    handle: list[Any] = []

    def hook(mod: Any, args: Any) -> None:
        if _heard(steps):
            _tell(steps, steps.forward, torch.is_grad_enabled())

    def arm() -> None:
        # a global forward hook takes every module off torch's fast path: only while it may tell
        if not handle:
            handle.append(module.register_module_forward_pre_hook(hook))

    def disarm() -> None:
        if handle:
            handle.pop().remove()

    steps.arm, steps.disarm = arm, disarm
    patches.call(disarm)
    arm()

    def make_train(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def train(self: Any, mode: bool = True) -> Any:
            if mode is False and _heard(steps):
                _tell(steps, steps.leave)
            return original(self, mode)
        return train

    patches.replace(torch.nn.Module, "train", make_train)


def _optimizers(steps: Steps, patches: Patches) -> None:
    from torch.optim import optimizer

    # paired: the post hook of a step whose pre hook counted
    heard: list[bool] = []

    def before(opt: Any, args: Any, kwargs: Any) -> None:
        heard.append(_heard(steps))
        if heard[-1]:
            _tell(steps, steps.optimizer_begin, opt)

    def after(opt: Any, args: Any, kwargs: Any) -> None:
        if heard and heard.pop():
            _tell(steps, steps.optimizer_end)

    patches.handle(optimizer.register_optimizer_step_pre_hook(before))
    patches.handle(optimizer.register_optimizer_step_post_hook(after))

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            steps.optimizers = True
            original(self, *args, **kwargs)
        return __init__

    patches.replace(optimizer.Optimizer, "__init__", make_init)


def _backward(steps: Steps, patches: Patches) -> None:
    import torch.autograd

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not _heard(steps):
                return original(tensors, *args, **kwargs)
            _tell(steps, steps.backward, tensors)
            try:
                return original(tensors, *args, **kwargs)
            finally:
                _tell(steps, steps.after_backward)
        return backward

    patches.replace(torch.autograd, "backward", make)


def _scaler(steps: Steps, patches: Patches) -> None:
    from torch.amp import grad_scaler

    def make_scale(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def scale(self: Any, outputs: Any) -> Any:
            scaled = original(self, outputs)
            if _heard(steps):
                _tell(steps, steps.scale, scaled, outputs)
            return scaled
        return scale

    def make_step(original: Callable[..., Any]) -> Callable[..., Any]:
        # a step the scaler skips (inf/NaN gradients) never calls optimizer.step(): still a step
        @functools.wraps(original)
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not _heard(steps):
                return original(self, optimizer, *args, **kwargs)
            _tell(steps, steps.optimizer_begin, optimizer)
            try:
                return original(self, optimizer, *args, **kwargs)
            finally:
                _tell(steps, steps.optimizer_end)
        return step

    patches.replace(grad_scaler.GradScaler, "scale", make_scale)
    patches.replace(grad_scaler.GradScaler, "step", make_step)


def _loader(steps: Steps, patches: Patches, clock: Callable[[], float]) -> None:
    from torch.utils.data import dataloader

    # each iterator's DataLoader arguments, as the script passed them
    made: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            original(self, loader, *args, **kwargs)
            made[self] = {"num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
                          "batch_size": loader.batch_size}
        return __init__

    def make_next(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            if not _heard(steps):
                return original(self)
            _tell(steps, steps.fetch_begin)
            start = clock()
            try:
                batch = original(self)
            except StopIteration:
                _tell(steps, steps.fetch_end, clock() - start, True, made.get(self))
                raise
            _tell(steps, steps.fetch_end, clock() - start, False, made.get(self))
            return batch
        return __next__

    patches.replace(dataloader._BaseDataLoaderIter, "__init__", make_init)
    patches.replace(dataloader._BaseDataLoaderIter, "__next__", make_next)
