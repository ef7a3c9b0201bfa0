"""The runner's hooks in torch: what tells :class:`~asyncthrottle.run.steps.Steps` of a script's
forwards, backwards, optimizer steps, ``GradScaler`` calls, evaluations and DataLoader batches."""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections.abc import Callable
from threading import get_ident
from typing import Any

from ..audit.patches import Patches
from .loaders import describe
from .steps import Steps

__all__ = ["install"]


def install(steps: Steps, patches: Patches, clock: Callable[[], float] = time.perf_counter) -> None:
    """Hook torch for ``steps``: torch's global hooks where it has them (optimizer steps, module
    forwards), wrappers elsewhere (``torch.autograd.backward``, which ``Tensor.backward`` calls,
    ``torch.autograd.grad``, ``GradScaler.scale``/``step``, ``Module.train``,
    ``Optimizer.__init__``, the DataLoader iterators' ``_next_data`` and
    ``DataLoader._get_iterator``, a process's ``start``).
    Only the loop's thread, outside a framework's ``fit``/``train``, is heard; nothing of it
    runs while ``torch.compile`` traces; ``patches.undo()`` removes them all."""
    import torch

    compiling = torch.compiler.is_compiling
    _forwards(steps, patches, compiling)
    _optimizers(steps, patches, compiling)
    _backward(steps, patches, compiling)
    _scaler(steps, patches)
    _loader(steps, patches, clock)
    _processes(steps, patches)


def _heard(steps: Steps) -> bool:
    # (the per-step hooks -- the forward hook, the optimizer hooks, backward -- test this
    # inline, and call their Steps method in a try of their own: a call less each, every step)
    return get_ident() == steps.thread and not steps.hushed


def _elsewhere(steps: Steps) -> None:
    """Training heard on a thread the runner does not follow: said in a report with no step."""
    if get_ident() != steps.thread:
        steps.seen["other_threads"] += 1


def _tell(steps: Steps, method: Callable[..., None], *args: Any) -> None:
    """Call ``method(*args)``; an error of the runner's never reaches the script: it stops the
    hooks, and the report says so."""
    try:
        method(*args)
    except Exception as exc:
        steps.stop_on(exc)


def _forwards(steps: Steps, patches: Patches, compiling: Callable[[], bool]) -> None:
    import torch
    from torch.nn.modules import module

    handle: list[Any] = []
    grad_enabled = torch.is_grad_enabled
    torch_file = module.__file__
    # the last call site's code, instruction and line: a frame's f_lineno scans its code's line
    # table from the start (about 14 us at the end of a 400-line function, unless a profiler or
    # tracer made the code's line array), and a loop calls its model from the same instruction
    # every step (the line is a function of the two)
    last: list[Any] = [None, -1, 0]

    def hook(mod: Any, args: Any) -> None:
        # first: Dynamo traces a global hook into a compiled module, and this returns at once
        if not compiling() and get_ident() == steps.thread and not steps.hushed:
            try:
                # the code and line that called the module: the first frame outside torch's
                # Module (inlined: every step)
                frame: Any = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename == torch_file:
                    frame = frame.f_back
                site = None
                if frame is not None:
                    code, lasti = frame.f_code, frame.f_lasti
                    if lasti != last[1] or code is not last[0]:
                        last[:] = code, lasti, frame.f_lineno
                    site = (code, last[2])
                steps.forward(grad_enabled(), mod, site)
            except Exception as exc:
                steps.stop_on(exc)

    steps.arm, steps.disarm = _switch(module, hook, handle, steps)
    patches.call(steps.disarm)
    _unseen(module, hook, patches)
    steps.arm()

    def make_train(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def train(self: Any, mode: bool = True) -> Any:
            if not compiling() and _heard(steps):
                _tell(steps, steps.leave if mode is False else steps.arm)
            return original(self, mode)
        return train

    patches.replace(torch.nn.Module, "train", make_train, eager=True)


def _switch(module: Any, hook: Callable[..., None], handle: list[Any],
            steps: Steps) -> tuple[Callable[[], None], Callable[[], None]]:
    """``arm()`` and ``disarm()`` of the global forward pre-hook: a global hook takes every module
    off torch's fast path, so it is in place only while the next forward may open or end a step
    (armed and disarmed once a step). The hook keeps one key in torch's dict of global forward
    pre-hooks, put in and taken out again (a dict item each way, where registering makes and
    removing drops a handle: three Python calls a step); a torch without that dict gets the
    public register and remove. Each keeps ``steps.armed``."""
    hooks = getattr(module, "_global_forward_pre_hooks", None)
    if isinstance(hooks, dict):
        # the key a handle would take (torch's hook ids are unique to the handle)
        key = module.register_module_forward_pre_hook(hook)
        key.remove()
        ident = key.id

        def arm() -> None:
            hooks[ident] = hook
            steps.armed = True

        def disarm() -> None:
            hooks.pop(ident, None)
            steps.armed = False

        return arm, disarm

    def arm_public() -> None:
        if not handle:
            handle.append(module.register_module_forward_pre_hook(hook))
        steps.armed = True

    def disarm_public() -> None:
        if handle:
            handle.pop().remove()
        steps.armed = False

    return arm_public, disarm_public


def _unseen(module: Any, hook: Callable[..., None], patches: Patches) -> None:
    """torch's test for global module hooks leaves the runner's out: ``torch.compile(model)``'s
    module warns on each call that global hooks fire for it an extra time, which the runner's
    hook (armed at a step's first forward) would make it say of a script that has none. A torch
    without the test, or without the dict the hook is kept in, is left as it is."""
    hooks = getattr(module, "_global_forward_pre_hooks", None)
    if not isinstance(hooks, dict) or not callable(getattr(module, "_has_any_global_hook", None)):
        return

    def make(original: Callable[[], Any]) -> Callable[[], Any]:
        @functools.wraps(original)
        def _has_any_global_hook() -> Any:
            # the runner's hook out of the dict while torch looks (the one key whose value is it)
            mine = [key for key, value in hooks.items() if value is hook]
            for key in mine:
                del hooks[key]
            try:
                return original()
            finally:
                for key in mine:
                    hooks[key] = hook
        return _has_any_global_hook

    patches.replace(module, "_has_any_global_hook", make, eager=True)


def _optimizers(steps: Steps, patches: Patches, compiling: Callable[[], bool]) -> None:
    from torch.optim import optimizer

    # paired by the frame that runs both hooks (torch's wrapper of the step): a step that raised
    # never calls its post hook
    def before(opt: Any, args: Any, kwargs: Any) -> None:
        if compiling():
            return
        if get_ident() == steps.thread and not steps.hushed:
            try:
                steps.optimizer_begin(opt, sys._getframe(1))
            except Exception as exc:
                steps.stop_on(exc)
        else:
            _elsewhere(steps)

    def after(opt: Any, args: Any, kwargs: Any) -> None:
        if not compiling() and get_ident() == steps.thread and not steps.hushed:
            try:
                steps.optimizer_end(sys._getframe(1))
            except Exception as exc:
                steps.stop_on(exc)

    patches.handle(optimizer.register_optimizer_step_pre_hook(before))
    patches.handle(optimizer.register_optimizer_step_post_hook(after))

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if get_ident() == steps.thread:
                steps.optimizers.made(self)
        return __init__

    patches.replace(optimizer.Optimizer, "__init__", make_init, eager=True)


def _backward(steps: Steps, patches: Patches, compiling: Callable[[], bool]) -> None:
    import torch.autograd

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            # (Dynamo does not trace into a backward() call: it runs it eagerly)
            if get_ident() != steps.thread or steps.hushed:
                _elsewhere(steps)
                return original(tensors, *args, **kwargs)
            if steps.backing:
                # a backward() inside backward(): reentrant checkpointing runs its block's forward
                # and backward again, as the outer one's work
                return original(tensors, *args, **kwargs)
            try:
                # (grad_tensors: the second argument)
                steps.backward(tensors, args[0] if args else kwargs.get("grad_tensors"))
            except Exception as exc:
                steps.stop_on(exc)
            steps.backing = True
            try:
                return original(tensors, *args, **kwargs)
            finally:
                steps.backing = False
                try:
                    steps.after_backward()
                except Exception as exc:
                    steps.stop_on(exc)
        return backward

    def make_grad(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def grad(*args: Any, **kwargs: Any) -> Any:
            steps.seen["autograd_grad"] += 1
            return original(*args, **kwargs)
        return grad

    patches.replace(torch.autograd, "backward", make, eager=True)
    patches.replace(torch.autograd, "grad", make_grad, eager=True)


def _scaler(steps: Steps, patches: Patches) -> None:
    from torch.amp import grad_scaler

    def make_scale(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def scale(self: Any, outputs: Any) -> Any:
            scaled = original(self, outputs)
            if _heard(steps):
                _tell(steps, steps.losses.scale, scaled, outputs)
            return scaled
        return scale

    def make_step(original: Callable[..., Any]) -> Callable[..., Any]:
        # a step the scaler skips (inf/NaN gradients) never calls optimizer.step(): still a step
        @functools.wraps(original)
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not _heard(steps):
                return original(self, optimizer, *args, **kwargs)
            frame = sys._getframe()
            _tell(steps, steps.optimizer_begin, optimizer, frame)
            try:
                return original(self, optimizer, *args, **kwargs)
            finally:
                _tell(steps, steps.optimizer_end, frame)
        return step

    patches.replace(grad_scaler.GradScaler, "scale", make_scale)
    patches.replace(grad_scaler.GradScaler, "step", make_step, eager=True)


def _loader(steps: Steps, patches: Patches, clock: Callable[[], float]) -> None:
    """The iterators' ``_next_data`` (not ``__next__``, whose own warnings name its caller, nor
    ``__init__``, whose pin-memory warning does: both stay the script's lines), and
    ``DataLoader._get_iterator``, where an iterator meets the DataLoader it was made from (which
    it keeps no reference to): what the script wrote is the DataLoader's, what is in effect the
    iterator's (:func:`~asyncthrottle.run.loaders.describe`)."""
    from torch.utils.data import dataloader

    # each iterator's DataLoader arguments, and the last one's (its weak reference and them)
    made: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
    last: list[Any] = [_gone, None]

    def described(iterator: Any) -> dict[str, Any]:
        found = made.get(iterator)
        if found is None:
            # an iterator made without DataLoader._get_iterator (fastai makes its own)
            found = made[iterator] = describe(iterator)
        last[:] = weakref.ref(iterator), found
        return found

    def make_iterator(original: Callable[..., Any]) -> Callable[..., Any]:
        # (called once an epoch, or once with persistent workers; the iterator's own warnings,
        # at stacklevel 2, still name torch's line: the original's frame calls it)
        @functools.wraps(original)
        def _get_iterator(self: Any) -> Any:
            iterator = original(self)
            if get_ident() == steps.thread and steps.error is None:
                try:
                    made[iterator] = describe(iterator, self)
                except Exception as exc:
                    steps.stop_on(exc)
            return iterator
        return _get_iterator

    def make_next(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _next_data(self: Any) -> Any:
            if get_ident() != steps.thread or steps.error is not None:
                return original(self)
            if steps.framework:
                return _framework_fetch(steps, original, self, clock, described)
            # (each batch: the Steps calls in a try of their own, the last iterator's arguments
            # without a call; fetch_begin() hushes the hooks while the loader works, fetch_end()
            # or load(False) lets them hear again)
            try:
                steps.fetch_begin()
            except Exception as exc:
                steps.stop_on(exc)
            start = clock()
            try:
                batch = original(self)
            except StopIteration:
                _tell(steps, steps.fetch_end, start, clock() - start, True, described(self))
                raise
            except BaseException:
                steps.load(False)
                raise
            seconds = clock() - start
            try:
                steps.fetch_end(start, seconds, False,
                                last[1] if last[0]() is self else described(self))
            except Exception as exc:
                steps.stop_on(exc)
            return batch
        return _next_data

    for name in ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter"):
        patches.replace(getattr(dataloader, name), "_next_data", make_next, eager=True)
    if callable(getattr(dataloader.DataLoader, "_get_iterator", None)):
        patches.replace(dataloader.DataLoader, "_get_iterator", make_iterator, eager=True)


def _framework_fetch(steps: Steps, original: Callable[..., Any], iterator: Any,
                     clock: Callable[[], float], described: Callable[[Any], Any]) -> Any:
    start = clock()
    steps.load(True)
    try:
        batch = original(iterator)
    finally:
        steps.load(False)
    _tell(steps, steps.framework_fetch, clock() - start, described(iterator))
    return batch


def _processes(steps: Steps, patches: Patches) -> None:
    """Count the processes the script starts (``mp.spawn``, a ``Process``): said when no step
    was found on its own."""
    from multiprocessing import process

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def start(self: Any) -> None:
            # a DataLoader's workers are the loader's, not the script's
            target = getattr(self, "_target", None)
            if not (getattr(target, "__module__", None) or "").startswith("torch.utils.data"):
                steps.seen["processes"] += 1
            original(self)
        return start

    patches.replace(process.BaseProcess, "start", make, eager=True)


def _gone() -> None:
    """A dead weak reference's answer: no iterator was described yet."""
    return None
