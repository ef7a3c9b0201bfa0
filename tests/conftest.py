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


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    torch = pytest.importorskip("torch")
    state = SimpleNamespace(capturing=False, device=0)
    FakeTorchEvent.made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeTorchEvent)
    monkeypatch.setattr(torch, "Event", FakeTorchEvent)  # the generic event the CUDA backend records
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state.device)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state.device)  # current_device's own C call
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
