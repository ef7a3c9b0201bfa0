"""The PyTorch backend's answers about torch devices that the integrations ask instead of naming kinds."""

from __future__ import annotations

import pytest

from asyncthrottle.backends.torch import copies_need_pinned_memory

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("device", "pinned"), [("cuda", True), ("cuda:1", True), ("xpu", True), ("hpu", True),
                                                ("cpu", False), ("mps", False), ("meta", False)])
def test_copies_overlap_only_from_pinned_memory_on_cuda_xpu_and_hpu(device: str, pinned: bool) -> None:
    assert copies_need_pinned_memory(torch.device(device)) is pinned


def test_no_device_is_the_cpu_whose_copies_need_no_pinning() -> None:
    assert copies_need_pinned_memory(None) is False
