"""The PyTorch backend's answers about torch devices, which the code outside ``backends/`` asks instead of naming
kinds."""

from __future__ import annotations

import pytest

from asyncthrottle.backends.torch import copies_need_pinned_memory, names_the_host

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("device", "pinned"), [("cuda", True), ("cuda:1", True), ("xpu", True), ("hpu", True),
                                                ("cpu", False), ("mps", False), ("meta", False)])
def test_copies_overlap_only_from_pinned_memory_on_cuda_xpu_and_hpu(device: str, pinned: bool) -> None:
    assert copies_need_pinned_memory(torch.device(device)) is pinned


def test_no_device_is_the_cpu_whose_copies_need_no_pinning() -> None:
    assert copies_need_pinned_memory(None) is False


@pytest.mark.parametrize(("device", "host"), [("cpu", True), ("cpu:0", True), ("cuda", False), ("cuda:1", False),
                                              ("mps", False), ("meta", False)])
def test_a_device_names_the_host_when_it_is_the_cpu(device: str, host: bool) -> None:
    assert names_the_host(device) is host and names_the_host(torch.device(device)) is host
    assert not names_the_host(device.split(":")[0] + "s")  # "cpus": no device, where str.startswith("cpu") says one


def test_what_is_no_device_names_no_host() -> None:
    assert not names_the_host(torch.float32) and not names_the_host(None) and not names_the_host(torch.zeros(1))
