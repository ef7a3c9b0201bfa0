"""Shared fixtures: skip device-marked tests on machines without that device."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests in sub-folders import helpers too

from helpers import FakeTorchEvent


def _available(kind: str) -> bool:
    try:
        import torch
    except ImportError:
        return False
    module = getattr(torch, kind, None)
    return bool(module is not None and module.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for kind in ("cuda", "mps", "xpu"):
        if _available(kind):
            continue
        skip = pytest.mark.skip(reason=f"needs a {kind} device")
        for item in items:
            if kind in item.keywords:
                item.add_marker(skip)


# torch._C's own call behind torch.cuda.current_device(): a CUDA build has it, a CPU-only build may not
_GET_DEVICE = "_cuda_getDevice"


@pytest.fixture(params=["with", "without"], ids=lambda build: f"torch._C {build} {_GET_DEVICE}")
def fake_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """CUDA faked on the CPU, as torch builds of both kinds would show it: one whose ``torch._C`` has
    ``_cuda_getDevice`` (the backend calls it for the current device) and one without it (a CPU-only
    build: the backend calls ``torch.cuda.current_device()``). The first is skipped where torch lacks it;
    the second removes it where torch has it."""
    torch = pytest.importorskip("torch")
    has = hasattr(torch._C, _GET_DEVICE)
    if request.param == "with" and not has:
        pytest.skip(f"this torch build has no torch._C.{_GET_DEVICE}")
    state = SimpleNamespace(capturing=False, device=0)
    FakeTorchEvent.made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeTorchEvent)
    monkeypatch.setattr(torch, "Event", FakeTorchEvent)  # the generic event the CUDA backend records
    # (the real one initialises CUDA first, then asks torch._C: faked whole, it asks nothing)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.device)
    if request.param == "with":
        monkeypatch.setattr(torch._C, _GET_DEVICE, lambda: state.device)
    elif has:
        monkeypatch.delattr(torch._C, _GET_DEVICE)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: f"current-stream-of-{index}")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state.capturing)
    return state


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off: what only it would free stays alive."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
