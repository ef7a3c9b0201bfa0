"""A missing optional framework raises ModuleNotFoundError with the extra to install, so importorskip skips."""

from __future__ import annotations

import importlib
import sys

import pytest


def _hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``import package`` (and any of its submodules) fail as if it were not installed."""
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize(("module", "package", "extra"), [
    ("asyncthrottle.lightning", "lightning", "lightning"),
    ("asyncthrottle.transformers", "transformers", "transformers"),
])
def test_an_integration_without_its_framework_is_skipped_by_importorskip(
        module: str, package: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, package)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ModuleNotFoundError, match=rf"pip install 'asyncthrottle\[{extra}\]'") as caught:
        importlib.import_module(module)
    assert caught.value.name.split(".")[0] == package
    with pytest.raises(pytest.skip.Exception):  # before: a plain ImportError, which importorskip raises on
        pytest.importorskip(module)


def test_jax_without_jax_is_a_module_not_found_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncthrottle.jax as atj

    _hide(monkeypatch, "jax")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'asyncthrottle\[jax\]'") as caught:
        atj.jax_events()
    assert caught.value.name.split(".")[0] == "jax"


def test_the_progress_bar_without_tqdm_is_a_module_not_found_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncthrottle as at

    _hide(monkeypatch, "tqdm")
    thr = at.Throttle(2, device="cpu")
    with pytest.raises(ModuleNotFoundError, match="pip install tqdm") as caught:
        list(thr.wrap(range(2), progress=True))
    assert caught.value.name.split(".")[0] == "tqdm"
