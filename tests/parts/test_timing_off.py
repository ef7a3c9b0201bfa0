"""Device timing that turns itself off mid-loop leaves the core consistent (events whose elapsed_time fails)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice, FakeEvent

STEPS = 40


class UntimedEvent(FakeEvent):
    """Like ``torch.cuda.Event()`` with its default ``enable_timing=False``: ``elapsed_time`` raises."""

    __slots__ = ()

    def elapsed_time(self, end: FakeEvent) -> float:
        raise RuntimeError("Both events must be created with argument 'enable_timing=True'")


def _wrap(thr: at.Throttle, dev: FakeDevice) -> None:
    for i in thr.wrap(range(STEPS)):
        dev.launch(0.001)
        thr.defer(float(i), name="loss")


def _step(thr: at.Throttle, dev: FakeDevice) -> None:
    for i in range(STEPS):
        with thr.step():
            dev.launch(0.001)
            thr.defer(float(i), name="loss")
    thr.drain()


def _begin_end(thr: at.Throttle, dev: FakeDevice) -> None:
    for i in range(STEPS):
        thr.begin_step()
        dev.launch(0.001)
        thr.defer(float(i), name="loss")
        thr.end_step()
    thr.drain()


@pytest.mark.parametrize("every", [1, 2, 8])
@pytest.mark.parametrize("loop", [_wrap, _step, _begin_end], ids=["wrap", "step", "begin_end"])
def test_timing_that_fails_at_its_first_read_turns_off_and_every_step_counts(
    every: int, loop: Callable[[at.Throttle, FakeDevice], None], caplog: pytest.LogCaptureFixture
) -> None:
    dev = FakeDevice()
    thr = at.Throttle(2, events=lambda: UntimedEvent(dev), wait=dev.wait("poll"), clock=dev.clock,
                      sample_every=every)
    seen: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: seen.append((step, values["loss"])))
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        loop(thr, dev)
    assert "device timing is off" in caplog.text
    stats = thr.stats
    assert stats.steps == stats.completed == STEPS
    assert seen == [(i, float(i)) for i in range(STEPS)]
    assert stats.device_samples == 0 and stats.device_ms_mean is None


def test_a_part_that_lets_go_while_supplying_an_event_is_not_asked_again() -> None:
    """The core's rule, not a patch in telemetry: scheduling by a part that let go is ignored."""
    dev = FakeDevice()
    thr = dev.throttle(2)
    core = inside(thr).core

    class OneShot:
        def __init__(self) -> None:
            self.asked: list[int] = []

        def supply_event(self, step: int) -> at.Event:
            self.asked.append(step)
            core.stop_supply(self)
            core.supply_next(self, step + 1)  # after letting go: ignored
            return dev.event()

        def supplied_idle(self, step: int, before: at.Event | None) -> None:
            pass

    part = OneShot()
    core.supply_from(part, 1)
    for _ in thr.wrap(range(5)):
        dev.launch(0.001)
    assert part.asked == [1] and core.supplier is None and thr.stats.steps == 5
