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
            ours = _callback(steps, framework, trainer, make)
        except Exception as exc:
            steps.error = exc
            return original(trainer, *args, **kwargs)
        steps.framework_begin()
        try:
            return original(trainer, *args, **kwargs)
        finally:
            if ours is not None:
                _remove(framework, trainer, ours.hooks)
            steps.framework_end(ours or _theirs(framework, trainer))
    return trains


def _callback(steps: Steps, framework: str, trainer: Any,
              make: Callable[[type], ThrottleHooks]) -> Source | None:
    """The runner's callback, added to ``trainer`` (None: the script has its own)."""
    if _theirs(framework, trainer) is not None:
        return None
    module = importlib.import_module(f"asyncthrottle.{framework}")
    callback = make(_observed(module.ThrottleCallback, steps))
    if framework == "lightning":
        trainer.callbacks.append(callback)
    else:
        trainer.add_callback(callback)
    known = {id(source.hooks): source for source in steps.sources}
    return known.get(id(callback)) or Source(callback, framework)


def _theirs(framework: str, trainer: Any) -> Source | None:
    callbacks = (trainer.callbacks if framework == "lightning"
                 else trainer.callback_handler.callbacks)
    for callback in callbacks:
        if isinstance(callback, ThrottleHooks):
            return Source(callback, framework)
    return None


def _remove(framework: str, trainer: Any, callback: ThrottleHooks) -> None:
    if framework == "lightning":
        if callback in trainer.callbacks:
            trainer.callbacks.remove(callback)
    else:
        trainer.remove_callback(callback)


def _observed(base: type, steps: Steps) -> type:
    """``base`` (a ``ThrottleCallback``) that tells the sync audit when a step is open."""

    class Observed(base):  # type: ignore[valid-type,misc]
        def begin(self, number: int | None = None) -> int:
            step: int = super().begin(number)
            if steps.sites is not None:
                steps.sites.in_step = True
            return step

        def end(self, loss: Any = None) -> None:
            try:
                super().end(loss)
            finally:
                if steps.sites is not None:
                    steps.sites.in_step = False

        def fail(self) -> None:
            try:
                super().fail()
            finally:
                if steps.sites is not None:
                    steps.sites.in_step = False

    Observed.__name__ = Observed.__qualname__ = base.__name__
    return Observed


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
