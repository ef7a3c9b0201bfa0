"""Conformance of every event backend, and device resolution (patched where no device exists)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import (
    FakeTorchEvent,
    inside,
)

import asyncthrottle as at
from asyncthrottle.backends import torch as devices
from asyncthrottle.testing import FakeDevice
from asyncthrottle.testing.simulated import ProcessDevice, SimulatedDevice

Launch = Callable[[], None]


@pytest.fixture(params=["fake", "cpu", "simulated", "process", pytest.param("cuda", marks=pytest.mark.cuda),
                        pytest.param("mps", marks=pytest.mark.mps), pytest.param("xpu", marks=pytest.mark.xpu)])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, Any], Launch]]:
    """Throttle options for one backend, and a function that launches one step of device work."""
    kind = request.param
    if kind == "fake":
        dev = FakeDevice()
        yield {"events": dev.event, "wait": dev.wait("poll"), "clock": dev.clock}, lambda: dev.launch(0.01)
    elif kind == "simulated":
        with SimulatedDevice() as sim:
            yield {"events": sim.event}, lambda: sim.launch(2e-4)
    elif kind == "process":  # the GIL-free simulated device of the benchmarks
        with ProcessDevice() as proc:
            yield {"events": proc.event}, lambda: proc.launch(2e-4)
    elif kind == "cpu":
        yield {"device": "cpu"}, lambda: None
    else:
        import torch

        x = torch.ones(256, 256, device=kind)

        def launch() -> None:
            for _ in range(20):
                x.mul_(1.0)

        yield {"device": kind}, launch


@pytest.mark.parametrize("depth", [1, 2, 4, None])
def test_wrapped_loop_conforms(backend: tuple[dict[str, Any], Launch], depth: int | None) -> None:
    options, launch = backend
    view = at.throttle(range(30), depth=depth, **options)
    seen = []
    for i in view:
        seen.append(i)
        launch()
    stats = view.stats
    assert seen == list(range(30))
    assert stats.steps == 30 and stats.completed == 30 and stats.in_flight == 0
    assert view.in_flight == 0
    assert 0 <= stats.max_in_flight <= (depth or 30)
    assert stats.wait_s >= 0 and stats.waits <= 30


def test_step_mark_and_drain_conform(backend: tuple[dict[str, Any], Launch]) -> None:
    options, launch = backend
    thr = at.Throttle(2, **options)
    for i in range(10):
        with thr.step() as n:
            assert n == i
            launch()
    for _ in range(10):
        launch()
        thr.mark()
        assert thr.in_flight <= 2
    thr.drain()
    assert thr.stats.steps == 20 and thr.stats.completed == 20 and thr.in_flight == 0


def test_fake_device_gives_exact_waits() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=2, wait="spin")
    for _ in thr.wrap(range(10)):
        dev.launch(0.010)  # device-bound: 10 ms device, 1 ms host per step
        dev.host(0.001)
    # Steps 0..9 run back to back from t=0: the last ends at 0.100 s, and the host waited for the rest.
    assert dev.clock() == pytest.approx(0.100)
    assert thr.stats.wait_s == pytest.approx(0.100 - 10 * 0.001)
    assert thr.stats.max_in_flight == 2


def test_cpu_backend_is_synchronous_and_never_waits() -> None:
    thr = at.Throttle(1, device="cpu")
    assert thr.synchronous
    assert list(thr.wrap(range(5))) == list(range(5))
    stats = thr.stats
    assert (stats.steps, stats.completed, stats.in_flight, stats.max_in_flight) == (5, 5, 0, 1)
    assert (stats.waits, stats.wait_s, stats.device_ms_mean) == (0, 0.0, None)  # nothing to time on the CPU


def test_auto_detection_checks_availability_not_just_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert devices.detect_device() == "cpu"
    assert at.Throttle(2).synchronous
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert devices.detect_device() == "cuda"


def test_cuda_events_are_cheap_and_recorded_on_the_devices_current_stream(fake_cuda: SimpleNamespace) -> None:
    torch = pytest.importorskip("torch")
    factory = devices.resolve_events("cuda:1")
    assert factory is not None
    event = factory()
    event.record()
    assert event._event.stream == "current-stream-of-1"  # type: ignore[attr-defined]  # not the current device
    assert FakeTorchEvent.made[-1] == {"device": torch.device("cuda:1"), "enable_timing": False}  # torch.Event
    fake_cuda.device = 1
    event.record()
    assert event._event.stream == "current"  # type: ignore[attr-defined]  # the current device: torch finds its stream
    unindexed = devices.resolve_events("cuda")
    assert unindexed is not None
    unindexed_event = unindexed()
    unindexed_event.record()
    assert unindexed_event._event.stream == "current"  # type: ignore[attr-defined]  # no Python Stream object


def test_block_strategy_asks_for_blocking_sync_events(fake_cuda: SimpleNamespace) -> None:
    thr = at.Throttle(2, device="cuda", wait="block", sample_every=4)
    for _ in range(5):
        with thr.step():
            pass
    # torch.Event ignores blocking=, so the block strategy keeps torch.cuda.Event (re-used like the others).
    assert FakeTorchEvent.made and all(kw["blocking"] is True for kw in FakeTorchEvent.made)
    assert {kw["enable_timing"] for kw in FakeTorchEvent.made} == {True, False}


def test_streams_option_records_one_event_per_stream(fake_cuda: SimpleNamespace) -> None:
    main, side = (SimpleNamespace(name=name, wait_stream=lambda other: None, wait_event=lambda event: None)
                  for name in ("main", "side"))  # what the throttle asks of a stream
    thr = at.Throttle(1, device="cuda", streams=[main, side], sample_every=None)
    with thr.step():
        pass
    (event,) = inside(thr).core.pending
    assert [e._event.stream.name for e in event.events] == ["main", "side"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="non-empty list of streams"):
        at.Throttle(1, device="cuda", streams=[])


def test_recording_during_cuda_graph_capture_says_where_to_call_it(fake_cuda: SimpleNamespace) -> None:
    thr = at.Throttle(2, device="cuda")
    fake_cuda.capturing = True
    with pytest.raises(RuntimeError, match="outside the captured region"), thr.step():
        pass
    with pytest.raises(RuntimeError, match="outside the captured region"):
        thr.mark()
    fake_cuda.capturing = False
    thr.mark()
    assert thr.stats.steps == 1


def test_generic_accelerators_use_torch_event(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(torch, "Event", lambda **kw: made.append(kw) or FakeTorchEvent())
    monkeypatch.setattr(devices, "_is_available", lambda torch, kind: kind == "meta")
    factory = devices.resolve_events("meta")
    assert factory is not None
    factory().record()
    assert made == [{"device": torch.device("meta"), "enable_timing": False}]


@pytest.mark.parametrize("device", ["xpu", "xpu:1"], ids=["current-device", "index-1"])
def test_xpu_events_join_the_side_streams_of_deferred_copies(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """An XPU event records ``torch.Event`` on the current stream (no Python ``Stream`` a step); a side stream it is
    asked to wait for (a deferred tensor copied under ``with torch.xpu.stream(side):``) is joined to the stream it
    records on, as on CUDA, not dropped; and it knows its device, so a copy on its own stream needs no join."""
    torch = pytest.importorskip("torch")
    waited: list[tuple[Any, Any]] = []

    class Stream:
        def __init__(self, name: Any) -> None:
            self.name = name

        def wait_stream(self, other: Any) -> None:
            waited.append((self.name, other))

    monkeypatch.setattr(torch, "Event", lambda **kw: FakeTorchEvent(**kw))
    monkeypatch.setattr(devices, "_is_available", lambda torch, kind: kind == "xpu")
    monkeypatch.setattr(torch.xpu, "current_stream", lambda index=None: Stream(f"current-of-{index}"))
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 1 if device == "xpu:1" else 0)
    monkeypatch.setattr(torch._C, "_xpu_getDevice", lambda: 0, raising=False)
    factory = devices.resolve_events(device)
    assert factory is not None
    event = factory()
    event.wait_stream("side")
    event.record()
    index = 1 if device == "xpu:1" else None
    assert waited == [(f"current-of-{index}", "side")]
    assert event.device_index() == (1 if device == "xpu:1" else 0)
