"""Calling a function once the script has imported a module (torch, a framework's trainer), and
not before: the runner imports nothing the script has not."""

from __future__ import annotations

import importlib.abc
import importlib.util
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
            spec = self._find_after(name, path, target)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Then(spec.loader, self.then.pop(name))
        return spec

    def _find_after(self, name: str, path: Any, target: Any) -> Any:
        """The spec of the first finder after this one on ``sys.meta_path`` that finds ``name``,
        each asked in order, as Python asks them (a site's or an editable install's finder,
        then ``PathFinder``); None: none finds it."""
        finders = sys.meta_path
        later = finders[finders.index(self) + 1:] if self in finders else list(finders)
        for finder in later:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is not None:
                spec = find_spec(name, path, target)
            elif sys.version_info < (3, 12):
                spec = _legacy_spec(finder, name, path)
            else:
                continue
            if spec is not None:
                return spec
        return None


def _legacy_spec(finder: Any, name: str, path: Any) -> Any:
    """The spec of a finder with only ``find_module()``, which Python < 3.12 still asks."""
    find_module = getattr(finder, "find_module", None)
    loader = find_module(name, path) if find_module is not None else None
    return importlib.util.spec_from_loader(name, loader) if loader is not None else None


class _Then(importlib.abc.Loader):
    """A loader that runs ``then(module)`` after the module it loads (everything else its
    loader's)."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader, as without the runner
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        if hasattr(self._loader, "exec_module"):
            self._loader.exec_module(module)
        else:
            # a loader older than exec_module: its load_module() puts the module in sys.modules
            self._loader.load_module(module.__name__)
        self._then(sys.modules.get(module.__name__, module))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
