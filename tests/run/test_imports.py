"""The runner's import hook: a module's callback once the script imported it, the module found by
the finders Python would ask, in their order (a site's or an editable install's import hook
first), and nothing left on ``sys.meta_path``.

In-process: the finders here are put on ``sys.meta_path`` as a ``sitecustomize`` would; what
Python does with them is the same in a subprocess, so none is needed."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from asyncthrottle.audit.patches import Patches
from asyncthrottle.run.imports import after_import


class Serving(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook that serves module ``name`` from memory (``served`` set in it)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name == self.name else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.served = True  # type: ignore[attr-defined]


@pytest.fixture
def patches() -> Iterator[Patches]:
    before = list(sys.meta_path)
    patches = Patches()
    try:
        yield patches
    finally:
        patches.undo()
        sys.meta_path[:] = before


@pytest.fixture
def fresh(request: pytest.FixtureRequest) -> Iterator[str]:
    """A module name of this test's own, out of ``sys.modules`` after it."""
    name = f"_imports_{request.node.name.replace('[', '_').replace(']', '_')}"
    yield name
    sys.modules.pop(name, None)


def test_a_module_an_earlier_import_hook_serves_is_its_and_is_heard(
        patches: Patches, fresh: str) -> None:
    # the hook sitecustomize installed, before the runner's: PathFinder alone finds nothing
    hook = Serving(fresh)
    sys.meta_path.insert(0, hook)
    heard: list[ModuleType] = []
    after_import({fresh: heard.append}, patches)
    module = importlib.import_module(fresh)
    assert module.served is True and module.__loader__ is hook
    assert module.__spec__ is not None and module.__spec__.loader is hook
    assert heard == [module]


def test_the_finders_are_asked_in_python_s_order_not_pathfinder_first(
        patches: Patches, fresh: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the module is on sys.path too: Python takes the hook's, which stands before PathFinder
    (tmp_path / f"{fresh}.py").write_text("served = False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.meta_path.insert(0, Serving(fresh))
    heard: list[ModuleType] = []
    after_import({fresh: heard.append}, patches)
    module = importlib.import_module(fresh)
    assert module.served is True and heard == [module]


def test_a_module_on_sys_path_is_found_and_heard_once(
        patches: Patches, fresh: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"{fresh}.py").write_text("served = 'from the file'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    heard: list[ModuleType] = []
    after_import({fresh: heard.append}, patches)
    module = importlib.import_module(fresh)
    assert module.served == "from the file" and heard == [module]
    assert module.__loader__.__class__.__name__ == "SourceFileLoader"
    del sys.modules[fresh]
    importlib.import_module(fresh)
    assert heard == [module]


def test_a_module_no_finder_finds_is_not_found_and_the_hook_goes_at_undo(
        patches: Patches, fresh: str) -> None:
    heard: list[ModuleType] = []
    after_import({fresh: heard.append}, patches)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(fresh)
    assert heard == []
    assert len(sys.meta_path) == len(set(map(id, sys.meta_path)))
    hooks = [f for f in sys.meta_path if type(f).__name__ == "_AfterImport"]
    patches.undo()
    assert not any(f in sys.meta_path for f in hooks)


class Legacy:
    """A finder and loader from before find_spec/exec_module (Python < 3.12 still asks it)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_module(self, name: str, path: Any = None) -> Any:
        return self if name == self.name else None

    def load_module(self, name: str) -> ModuleType:
        module = sys.modules.setdefault(name, ModuleType(name))
        module.served = "legacy"  # type: ignore[attr-defined]
        return module


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 asks no find_module()")
@pytest.mark.filterwarnings("ignore::ImportWarning")
def test_a_legacy_finder_and_loader_are_asked_as_python_asks_them(
        patches: Patches, fresh: str) -> None:
    sys.meta_path.insert(0, Legacy(fresh))  # type: ignore[arg-type]
    heard: list[ModuleType] = []
    after_import({fresh: heard.append}, patches)
    module = importlib.import_module(fresh)
    assert module.served == "legacy" and heard == [module]
