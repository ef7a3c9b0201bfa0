"""Options follow one rule on every backend: a wrong type is a TypeError, a wrong value a ValueError."""

from __future__ import annotations

from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice

WRONG_TYPE = [
    {"sample_every": "8"}, {"ranks_every": "100"}, {"detect_sync": 1}, {"stall": [1]}, {"trace": "8"},
    {"timeout": "5"}, {"drain": "yes"}, {"nvtx": 1}, {"max_memory": "1GB"}, {"memory": 5}, {"to": 3},
    {"depth": 2.5}, {"depth": "auto", "max_depth": 2.5}, {"clock": 3},
]
WRONG_VALUE = [
    {"stall": -5.0}, {"stall": "often"}, {"depth": "deep"}, {"depth": 0}, {"sample_every": 0}, {"ranks_every": 0},
    {"trace": -1}, {"timeout": 0}, {"detect_sync": "loud"}, {"max_memory": -1}, {"depth": 2, "max_depth": 4},
    {"wait": "sometimes"},
]


def _name(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={v!r}" for k, v in options.items())


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize("options", WRONG_TYPE, ids=_name)
def test_a_wrong_type_is_a_type_error_naming_the_option(options: dict[str, Any], backend: str) -> None:
    options = dict(options)
    depth = options.pop("depth", 2)
    with pytest.raises(TypeError, match=next(iter(options), "depth")):
        _make(backend, depth, options)


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize("options", WRONG_VALUE, ids=_name)
def test_a_wrong_value_is_a_value_error_naming_the_option(options: dict[str, Any], backend: str) -> None:
    options = dict(options)
    depth = options.pop("depth", 2)
    with pytest.raises(ValueError, match=next(iter(options), "depth")):
        _make(backend, depth, options)


def test_a_close_miss_says_how_to_write_it() -> None:
    with pytest.raises(ValueError, match="write it detect_sync='warn'"):
        at.Throttle(device="cpu", detect_sync="Warn")
    with pytest.raises(ValueError, match="write it depth='auto'"):
        at.Throttle("Auto", device="cpu")


def _make(backend: str, depth: Any, options: dict[str, Any]) -> at.Throttle:
    if backend == "cpu":
        return at.Throttle(depth, device="cpu", **options)
    dev = FakeDevice()
    return at.Throttle(depth, events=dev.event, clock=options.pop("clock", dev.clock), **options)
