"""The report's ``environment``: what a bug report needs, taken without starting anything the
script did not (no device asked of torch but the steps' own)."""

from __future__ import annotations

import datetime
import platform
import sys
from types import SimpleNamespace
from typing import Any

import pytest

import asyncthrottle
from asyncthrottle.run.environment import environment

WHEN = datetime.datetime(2026, 12, 7, 20, 5, 9, 123456, tzinfo=datetime.timezone.utc)


def test_the_environment_names_date_python_torch_device_os_version_rank_and_world() -> None:
    found = environment("cpu", (1, 4), on_host=True, now=lambda: WHEN)
    assert found == {
        "date": "2026-12-07T20:05:09+00:00",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "device": "cpu", "device_name": found["device_name"], "os": platform.platform(),
        "asyncthrottle": asyncthrottle.__version__, "rank": 1, "world_size": 4}
    assert found["device_name"] is None or found["device_name"].strip() == found["device_name"]
    alone = environment(None, None, now=lambda: WHEN)
    assert (alone["rank"], alone["world_size"], alone["device"], alone["device_name"]) == (
        0, 1, None, None)


def test_a_gpu_s_name_is_asked_of_its_own_torch_module(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []

    def name(device: Any) -> str:
        asked.append(device)
        return "NVIDIA H100 80GB HBM3"

    def broken(device: Any) -> str:
        raise RuntimeError("no driver")

    fake = SimpleNamespace(__version__="9.9", cuda=SimpleNamespace(get_device_name=name),
                           xpu=SimpleNamespace(get_device_name=broken))
    monkeypatch.setitem(sys.modules, "torch", fake)
    found = environment("cuda:1", None, now=lambda: WHEN)
    assert (found["torch"], found["device_name"], asked) == ("9.9", "NVIDIA H100 80GB HBM3",
                                                            ["cuda:1"])
    # a device whose name cannot be had, or a kind with none: not known, and the report goes on
    assert environment("xpu:0", None, now=lambda: WHEN)["device_name"] is None
    assert environment("meta", None, now=lambda: WHEN)["device_name"] is None


def test_the_host_s_name_is_its_processor_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncthrottle.run import environment as module

    monkeypatch.setattr(module, "_cpu_name", lambda: "a processor")
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(__version__="9.9"))
    assert environment("cpu", None, on_host=True, now=lambda: WHEN)["device_name"] == (
        "a processor")
    # a device not on the host, with no torch module of its kind: not known
    assert environment("cpu", None, now=lambda: WHEN)["device_name"] is None


def test_without_torch_imported_its_version_is_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert environment(None, None, now=lambda: WHEN)["torch"] is None
