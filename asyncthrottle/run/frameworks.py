"""Lightning's ``Trainer.fit`` and the HF ``Trainer.train`` under the runner: each gets this
library's callback once the script imports the framework, and the generic hooks stand aside."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..audit.patches import Patches
from ..framework import ThrottleHooks
from .imports import after_import
from .source import Source
from .steps import Steps

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

    after_import({name: patch for name in _TRAINERS}, patches)


def _training(steps: Steps, framework: str, original: Callable[..., Any],
              make: Callable[[type], ThrottleHooks]) -> Callable[..., Any]:
    @functools.wraps(original)
    def trains(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if steps.error is not None:
            return original(trainer, *args, **kwargs)
        try:
            source, added = _source(steps, framework, trainer, make)
        except Exception as exc:
            steps.stop_on(exc)
            return original(trainer, *args, **kwargs)
        steps.framework_begin(source)
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
    known = {id(source.hooks): source for source in steps.sources}
    if hooks is None:
        # one callback for every fit()/train() of the script: their steps add up
        mine = [s for s in steps.sources if s.framework == framework and s is not steps.runner]
        hooks = mine[0].hooks if mine else make(
            importlib.import_module(f"asyncthrottle.{framework}").ThrottleCallback)
        if framework == "lightning":
            trainer.callbacks.append(hooks)
        else:
            trainer.add_callback(hooks)
    source = known.get(id(hooks))
    if source is None:
        source = Source(hooks, framework)
        source.watch(steps.sites)
        steps.sources.append(source)
    return source, added


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
