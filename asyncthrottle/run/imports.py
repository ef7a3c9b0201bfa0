"""Calling a function once the script has imported a module (torch, a framework's trainer), and
not before: the runner imports nothing the script has not."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..audit.patches import Patches

__all__ = ["after_import"]


def after_import(then: dict[str, Callable[[ModuleType], None]], patches: Patches) -> None:
    """Call ``then[name](module)`` once module ``name`` is imported: now for those already
    imported, else right after the script's import of it has run the module (each once);
    ``patches.undo()`` stops listening."""
    waiting = {}
    for name, call in then.items():
        if name in sys.modules:
            call(sys.modules[name])
        else:
            waiting[name] = call
    if not waiting:
        return
    finder = _AfterImport(waiting)
    sys.meta_path.insert(0, finder)
    patches.call(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)


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
        spec.loader = _Then(spec.loader, self.then.pop(name))
        return spec


class _Then(importlib.abc.Loader):
    """A loader that runs ``then(module)`` after the module it loads (everything else its
    loader's)."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader, as without the runner
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
