"""Reused events: few alive however many steps run, and none re-recorded while anything refers to it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import (
    CountingTorchEvent,
    inside,
)

import asyncthrottle as at
from asyncthrottle.backends import pool
from asyncthrottle.core.errors import ThrottleTimeout
from asyncthrottle.parts.timing import DeviceTiming
from asyncthrottle.testing import FakeDevice


def _plain() -> Any:
    return FakeDevice().event()


def test_the_pool_hands_out_again_only_what_nobody_holds() -> None:
    events = pool.EventPool(_plain)
    first = events()
    second = events()
    assert events.made == 2 and first is not second
    held = first
    del first
    assert events() is not held and events.made == 3  # `held` still refers to the oldest: a new one
    del held
    assert events.made == 3 and len(events) == 3
    again = events()  # the oldest is free now
    assert events.made == 3 and len(events) == 3
    assert again is not second


def test_a_full_ring_forgets_what_is_held_and_counts_that_cannot_tell_never_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = pool.EventPool(_plain, limit=4)
    kept = [events() for _ in range(10)]  # every one held (a user keeping Deferreds)
    assert events.made == 10 and len(events) == 4
    del kept
    events()
    assert events.made == 10  # a forgotten one is never reused; the ring's are
    monkeypatch.setattr(pool, "_ALONE", -1)  # an interpreter without reference counts
    blind = pool.EventPool(_plain)
    for _ in range(5):
        blind()
    assert blind.made == 5
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        pool.EventPool(_plain, limit=0)


@pytest.fixture
def counted(fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDevice]:
    """CUDA resolved to CountingTorchEvent on a fake device: every event made and recorded is seen."""
    torch = pytest.importorskip("torch")
    dev = FakeDevice()
    CountingTorchEvent.reset(dev)
    monkeypatch.setattr(torch, "Event", CountingTorchEvent)
    yield dev
    CountingTorchEvent.guard = None


def _made(timing: bool) -> int:
    return sum(1 for e in CountingTorchEvent.made if e.kwargs["enable_timing"] == timing)


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("sample_every", [8, None])
def test_steady_state_keeps_depth_plus_a_constant_events_over_10k_steps(
    counted: FakeDevice, depth: int, sample_every: int | None
) -> None:
    dev = counted
    thr = at.Throttle(depth, device="cuda", wait=dev.wait("spin"), clock=dev.clock, sample_every=sample_every)
    for i in thr.wrap(range(10_000)):
        dev.launch(0.001)  # device-bound: the host waits, depth steps stay in flight
        dev.host(0.0002)
        loss = thr.defer(float(i), name="loss")  # a reference to the step's event until the next step
    assert thr.stats.steps == 10_000 and thr.stats.max_in_flight == depth and loss.get() == 9999.0
    assert _made(timing=False) <= depth + 2  # re-recorded in turn, not made per step
    assert _made(timing=True) <= (6 if sample_every else 0)  # only sampled steps time, and those reuse too
    assert sum(e.records for e in CountingTorchEvent.made) >= 10_000


def test_a_closed_throttle_lets_go_of_the_events_kept_for_reuse(counted: FakeDevice) -> None:
    dev = counted
    thr = at.Throttle(2, device="cuda", wait=dev.wait("spin"), clock=dev.clock)
    for i in thr.wrap(range(20)):
        dev.launch(0.001)
        loss = thr.defer(float(i), name="loss")
    events = inside(thr).core.new_event
    assert isinstance(events, pool.EventPool) and len(events) > 0
    thr.close()
    assert len(events) == 0 and loss.get() == 19.0  # (a kept value keeps its own event)


def test_no_event_is_re_recorded_while_anything_refers_to_it(counted: FakeDevice) -> None:
    dev = counted
    thr = at.Throttle(2, device="cuda", wait=dev.wait("spin"), clock=dev.clock, sample_every=2, trace=16, timeout=1.0)
    timing = inside(thr).part(DeviceTiming)
    assert timing is not None
    kept: list[at.Deferred] = []  # deferred values the test holds on to (every 7th, and the last few)
    copies: list[tuple[Any, ...]] = []  # another thread's copy of the pending queue (stats, in_flight)

    def holders() -> Iterator[tuple[Any, int]]:
        """(event, the step whose recording it refers to) for everything that may still read an event."""
        core = inside(thr).core
        yield from ((event, core.completed + i) for i, event in enumerate(core.pending))
        yield from ((d._event, d.step) for d in kept)
        for copy in copies:
            yield from ((event, -1) for event in copy)
        for step, before, end, start in timing.ends:  # samples waiting for elapsed_time
            yield before, step - 1
            yield end, step
            yield start, step
        if timing._start is not None:  # a marker waiting for its step's end
            yield timing._start, timing._start_step
        if timing._before is not None:
            yield timing._before, timing._before_step

    def guard(raw: CountingTorchEvent) -> None:
        now = inside(thr).core.steps  # the step being recorded (a sampled step's timing event is held for it already)
        for held, step in holders():
            if getattr(held, "_event", None) is raw:
                assert step == now, f"step {now} re-records the event that step {step}'s reader still refers to"

    CountingTorchEvent.guard = guard

    def run(n: int, *, stop: int | None = None, fail: int | None = None) -> None:
        for i in thr.wrap(range(n)):
            dev.launch(0.001)
            dev.host(0.0002)
            deferred = thr.defer(float(i), name="loss")
            if i % 7 == 0:
                kept.append(deferred)
            if i % 11 == 0:
                copies[:] = [tuple(inside(thr).core.pending)]
            if i % 13 == 0:
                copies.clear()
            if i == stop:
                break
            if i == fail:
                raise KeyError("in the body")

    run(300)
    run(50, stop=20)  # a break records its step
    with pytest.raises(KeyError):
        run(50, fail=30)  # a failed body records nothing
    dev.launch(10.0)  # a step that outlasts the timeout
    with pytest.raises(ThrottleTimeout):
        run(5)
    dev.synchronize()
    run(100)
    kept.clear()
    run(100)
    assert thr.stats.steps > 500
    assert _made(timing=False) <= 60  # the held ones were not reused, the rest were
    assert all(d.ready() for d in kept)


def test_user_events_are_never_pooled() -> None:
    dev = FakeDevice()
    made: list[Any] = []

    def factory() -> Any:
        made.append(dev.event())
        return made[-1]

    thr = at.Throttle(2, events=factory, wait=dev.wait("spin"), clock=dev.clock, sample_every=None)
    for _ in thr.wrap(range(50)):
        dev.launch(0.001)
    assert len(made) == 50 and len({id(e) for e in made}) == 50  # one per step, each recorded once


def test_values_a_user_keeps_do_not_keep_their_steps_events_from_reuse(counted: FakeDevice) -> None:
    dev = counted
    thr = at.Throttle(2, device="cuda", wait=dev.wait("spin"), clock=dev.clock, sample_every=None)
    losses = []
    for i in thr.wrap(range(1000)):
        dev.launch(0.001)
        losses.append(thr.defer(float(i), name="loss"))  # every value kept, as a logging list does
    assert [d.get() for d in losses] == [float(i) for i in range(1000)]
    assert _made(timing=False) <= 2 + 3  # a delivered value lets go of its event
