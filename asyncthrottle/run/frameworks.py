"""Lightning's ``Trainer.fit`` and the HF ``Trainer.train`` under the runner: each gets this
library's callback once the script imports the framework, and the generic hooks stand aside."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..framework import ThrottleHooks
from .patches import Patches
from .steps import Source, Steps

__all__ = ["watch"]

# the module that defines each Trainer, and the method that trains
_TRAINERS = {
    "lightning.pytorch.trainer.trainer": ("lightning", "fit"),
    "transformers.trainer": ("transformers", "train"),
}


def watch(steps: Steps, patches: Patches, make: Callable[[type], ThrottleHooks]) -> None:
    """Patch each framework's Trainer as soon as it is imported (now, if it already is).

    ``make(callback_class)`` builds the runner's callback from the framework's
    ``ThrottleCallback`` class.
    """
    def patch(module: ModuleType) -> None:
        framework, method = _TRAINERS[module.__name__]
        patches.replace(module.Trainer, method,
                        lambda original: _training(steps, framework, original, make))

    _audited(steps, patches)
    finder = _AfterImport({name: patch for name in _TRAINERS})
    for name in _TRAINERS:
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, finder)
    patches.call(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)


def _training(steps: Steps, framework: str, original: Callable[..., Any],
              make: Callable[[type], ThrottleHooks]) -> Callable[..., Any]:
    @functools.wraps(original)
    def trains(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if steps.error is not None:
            return original(trainer, *args, **kwargs)
        try:
            source, added = _source(steps, framework, trainer, make)
        except Exception as exc:
            steps.error = exc
            return original(trainer, *args, **kwargs)
        steps.framework_begin()
        try:
            return original(trainer, *args, **kwargs)
        finally:
            if added:
                _remove(framework, trainer, source.hooks)
            steps.framework_end(source)
    return trains


def _source(steps: Steps, framework: str, trainer: Any,
            make: Callable[[type], ThrottleHooks]) -> tuple[Source, bool]:
    """The callback that finds the steps of this ``train()``/``fit()``, taken before it runs (its
    losses are heard from its first step), and whether the runner added it: the script's own
    ``ThrottleCallback`` if it has one (a second one would throttle twice), else the runner's."""
    hooks = _theirs(framework, trainer)
    added = hooks is None
    if hooks is None:
        module = importlib.import_module(f"asyncthrottle.{framework}")
        hooks = make(module.ThrottleCallback)
        if framework == "lightning":
            trainer.callbacks.append(hooks)
        else:
            trainer.add_callback(hooks)
    known = {id(source.hooks): source for source in steps.sources}
    return known.get(id(hooks)) or Source(hooks, framework), added


def _theirs(framework: str, trainer: Any) -> ThrottleHooks | None:
    callbacks = (trainer.callbacks if framework == "lightning"
                 else trainer.callback_handler.callbacks)
    for callback in callbacks:
        if isinstance(callback, ThrottleHooks):
            return callback
    return None


def _remove(framework: str, trainer: Any, callback: ThrottleHooks) -> None:
    if framework == "lightning":
        if callback in trainer.callbacks:
            trainer.callbacks.remove(callback)
    else:
        trainer.remove_callback(callback)


def _audited(steps: Steps, patches: Patches) -> None:
    """Inside a ``fit()``/``train()``, a framework callback's step (the runner's or the
    script's own) tells the sync audit when it is open: patched on :class:`ThrottleHooks`, the
    class the callbacks share (a patched instance, or a class of the runner's, would not pickle
    under ``ddp_spawn``)."""
    def opens(original: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(original)
        def begin(self: ThrottleHooks, *args: Any, **kwargs: Any) -> int:
            step = original(self, *args, **kwargs)
            if steps.framework and steps.sites is not None:
                steps.sites.in_step = True
            return step
        return begin

    def closes(original: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(original)
        def ends(self: ThrottleHooks, *args: Any, **kwargs: Any) -> None:
            try:
                original(self, *args, **kwargs)
            finally:
                if steps.framework and steps.sites is not None:
                    steps.sites.in_step = False
        return ends

    patches.replace(ThrottleHooks, "begin", opens)
    patches.replace(ThrottleHooks, "end", closes)
    patches.replace(ThrottleHooks, "fail", closes)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then[name](module)`` once module ``name`` has been executed."""

    def __init__(self, then: dict[str, Callable[[ModuleType], None]]) -> None:
        self.then = then
        self._finding: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.then or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Then(spec.loader, self.then[name])
        return spec


class _Then(importlib.abc.Loader):
    """A loader that runs ``then(module)`` after the module it loads (everything else its
    loader's)."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
