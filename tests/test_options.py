"""Options follow one rule on every backend: a wrong type is a TypeError, a wrong value a ValueError."""

from __future__ import annotations

import time
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


class _Stream:
    """What the throttle asks of a stream: wait_stream and wait_event, as torch.Stream has."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "stream"


WRONG_TYPE = [
    {"sample_every": "8"}, {"ranks_every": "100"}, {"detect_sync": 1}, {"stall": [1]}, {"trace": "8"},
    {"timeout": "5"}, {"drain": "yes"}, {"nvtx": 1}, {"max_memory": "1GB"}, {"memory": 5}, {"to": 3},
    {"depth": 2.5}, {"depth": "auto", "max_depth": 2.5}, {"clock": 3},
    {"streams": 5}, {"streams": "side"}, {"streams": [1, 2]}, {"streams": (_Stream(), "side")},
    {"nonfinite": 1}, {"nonfinite": True}, {"ranks_timeout": "60"}, {"ranks_timeout": None},
]
WRONG_VALUE = [
    {"stall": -5.0}, {"stall": "often"}, {"depth": "deep"}, {"depth": 0}, {"sample_every": 0}, {"ranks_every": 0},
    {"trace": -1}, {"timeout": 0}, {"detect_sync": "loud"}, {"max_memory": -1}, {"depth": 2, "max_depth": 4},
    {"wait": "sometimes"}, {"streams": []}, {"nonfinite": "loud"}, {"ranks_timeout": 0},
    {"ranks_timeout": float("inf")},
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


@pytest.mark.parametrize("streams", [[], 5, [1, 2]], ids=repr)
def test_streams_are_checked_alike_on_every_backend(streams: Any, fake_cuda: Any) -> None:
    """The check runs before the device is resolved: the CPU and CUDA refuse a value alike."""
    errors = []
    for device in ("cpu", "cuda", "jax"):
        with pytest.raises((TypeError, ValueError), match="streams") as caught:
            at.Throttle(2, device=device, streams=streams)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1] == errors[2], errors


# Arguments of the throttle's calls follow the same rule: (call, error, the argument it names).
CALLS = [
    (lambda thr: thr.section(""), ValueError, "section name"),
    (lambda thr: thr.section(5), TypeError, "section name"),
    (lambda thr: thr.section("forward", collective="yes"), TypeError, "collective"),
    (lambda thr: thr.section("forward", collective=1), TypeError, "collective"),
    (lambda thr: thr.end_step(failed="no"), TypeError, "failed"),
    (lambda thr: thr.end_step(failed=0), TypeError, "failed"),
    (lambda thr: thr.pause(at="x"), TypeError, "at"),
    (lambda thr: thr.pause(at=float("nan")), ValueError, "at"),
    (lambda thr: thr.pause(at=time.time()), ValueError, r"at.*time\.perf_counter\(\)"),
]


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize(("call", "error", "names"), CALLS, ids=[str(i) for i in range(len(CALLS))])
def test_a_calls_wrong_argument_is_refused_naming_it(call: Any, error: type, names: str, backend: str) -> None:
    thr = at.Throttle(2, device="cpu") if backend == "cpu" else FakeDevice().throttle(2)
    thr.section("forward", collective=True)  # made once: a second call must not take 1 for True
    thr.begin_step()
    with pytest.raises(error, match=names):
        call(thr)
    thr.end_step()  # a refused end_step() leaves the step open
    assert thr.stats.steps == 1
    thr.pause()
    assert thr.stats.wall_s < 3600  # not from an epoch timestamp
