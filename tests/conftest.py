"""Shared fixtures: skip device-marked tests on machines without that device."""

from __future__ import annotations

import pytest


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
