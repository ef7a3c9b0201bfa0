"""Host time adds up inside passes (wall = fetch + between + body + wait); what happens between passes is not
the loop's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice

MS = 1e-3


def _adds_up(stats: at.Stats) -> None:
    assert stats.fetch_s + stats.between_s + stats.body_s + stats.wait_s == pytest.approx(stats.wall_s)


@pytest.mark.parametrize("drain_at_end", [True, False])
def test_a_drain_after_a_break_is_not_taken_from_the_body(drain_at_end: bool) -> None:
    dev = FakeDevice()
    thr = dev.throttle(None, wait="spin", drain=drain_at_end)
    for i in thr.wrap(range(10)):
        dev.host(10 * MS)
        dev.launch(100 * MS)
        if i == 3:
            break
    thr.drain()  # outside the pass: waits 370 ms for the device (busy until 410 ms)
    stats = thr.stats
    assert stats.body_s == pytest.approx(40 * MS)
    assert stats.wait_s == 0.0 and stats.wait_outside_s == pytest.approx(370 * MS, abs=1 * MS)
    assert stats.verdict == "host-bound"
    _adds_up(stats)
    assert "outside the loop: waited 0.370 s" in stats.summary()


def test_a_failed_steps_body_in_a_step_loop_is_body_not_between() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    for i in range(4):
        dev.host(1 * MS)  # between steps: the loop's own (a batch taken, or anything else), never fetching
        try:
            with thr.step():
                dev.host(20 * MS)
                if i == 1:
                    raise ValueError
        except ValueError:
            pass
    thr.drain()
    stats = thr.stats
    assert stats.between_s == pytest.approx(3 * MS)  # the first gap is before the pass began
    assert stats.fetch_s == 0.0  # the throttle saw no fetch
    assert stats.body_s == pytest.approx(80 * MS)
    _adds_up(stats)


def test_retries_of_begin_step_after_a_timeout_count_the_gap_once() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, timeout=0.1)
    thr.begin_step()
    dev.launch(10.0)  # a step the device takes 10 s over
    thr.end_step()
    dev.host(500 * MS)
    for _ in range(200):
        try:
            thr.begin_step()
            break
        except at.ThrottleTimeout:
            pass
    thr.end_step()
    thr.drain()
    stats = thr.stats
    assert stats.between_s == pytest.approx(500 * MS, abs=2 * MS)  # not 20 x the growing gap
    _adds_up(stats)


def test_the_time_of_a_fetch_that_raises_is_fetching() -> None:
    dev = FakeDevice()

    def source() -> Iterator[int]:
        yield 0
        dev.host(300 * MS)
        raise OSError("a corrupt shard")

    thr = dev.throttle(2)
    with pytest.raises(OSError):
        for _ in thr.wrap(source()):
            dev.host(10 * MS)
    stats = thr.stats
    assert stats.fetch_s == pytest.approx(300 * MS)
    assert stats.body_s == pytest.approx(10 * MS)


def test_a_wait_inside_the_body_is_counted_once_in_the_trace(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(4, wait="spin", trace=100)
    values = []
    for i in thr.wrap(range(6)):
        dev.host(1 * MS)
        dev.launch(10 * MS)
        values.append(thr.defer(float(i)))
        if i == 3:
            assert values[2].get() == 2.0  # a wait inside the body
    path = tmp_path / "t.json"
    thr.export_trace(path)
    doc = json.loads(path.read_text())
    totals = doc["otherData"]["asyncthrottle"]["host_s"]
    stats = thr.stats
    assert totals["wait"] == pytest.approx(stats.wait_s)
    assert totals["body"] == pytest.approx(stats.body_s, abs=1e-4)
    assert sum(totals.values()) == pytest.approx(stats.wall_s, abs=1e-4)


@pytest.mark.parametrize("between", ["drain", "pass", "pass, no drain"])
def test_an_evaluation_between_epochs_is_not_device_idle(between: str) -> None:
    dev = FakeDevice()
    # no drain: the step before the pause is still in flight when the next pass starts
    thr = dev.throttle(2, sample_every=2, drain=between != "pass, no drain")
    for _epoch in range(3):
        if between.startswith("pass"):
            for _ in thr.wrap(range(8)):
                dev.launch(10 * MS)
        else:
            for _ in range(8):
                with thr.step():
                    dev.launch(10 * MS)
            thr.drain()
        dev.host(1.0)  # evaluation, checkpointing: a second of host time outside the loop
    stats = thr.stats
    assert stats.device_samples >= 10
    assert stats.device_ms_p90 == pytest.approx(10.0)  # no sample spans the pause
    assert stats.idle_fraction is not None and stats.idle_fraction < 0.05


def test_the_in_flight_histogram_does_not_grow_with_the_depth() -> None:
    thr = at.Throttle(10**7, device="cpu")
    assert len(thr.stats.in_flight_histogram) <= 64
    huge = FakeDevice().throttle(2**62)
    for _ in huge.wrap(range(3)):
        pass
    assert len(huge.stats.as_dict()) < 100


def test_pause_ends_a_step_loops_pass_without_waiting() -> None:
    dev = FakeDevice()
    thr = dev.throttle(None)
    for _ in range(3):
        with thr.step():
            dev.host(10 * MS)
            dev.launch(100 * MS)
    thr.pause()  # training stopped (an exception in a framework): no wait, the pass ends now
    assert thr.stats.waits == 0 and thr.stats.in_flight == 3
    dev.host(2.0)
    with thr.step():
        dev.host(10 * MS)
    stats = thr.stats
    assert stats.wall_s == pytest.approx(40 * MS)  # the 2 s between are not loop time
    thr.begin_step()
    with pytest.raises(RuntimeError, match="pause\\(\\) was called with a step open"):
        thr.pause()
    thr.end_step()
    with pytest.raises(RuntimeError, match="inside a wrapped loop"):
        for _ in thr.wrap(range(2)):
            thr.pause()


class _SlowRecord:
    """A part whose work at each record takes 5 ms of the host's (a trace, sections, deferred
    values)."""

    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev

    def on_record(self, step: int, event: object, now: float) -> None:
        self.dev.host(5 * MS)


@pytest.mark.parametrize("listened", [False, True])
def test_the_fetch_is_the_sources_time_not_the_records(listened: bool) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=None)
    if listened:
        thr.subscribe(_SlowRecord(dev))  # the general path: the record tells a part

    def source() -> Iterator[int]:
        for i in range(5):
            dev.host(1 * MS)  # the loader's own time
            yield i

    for _ in thr.wrap(source()):
        dev.host(2 * MS)
    stats = thr.stats
    # five fetches and the one that found the source exhausted: the source's 1 ms each, nothing of
    # the records' 5 ms (counted with the body, where the loop's own Python is)
    assert stats.fetch_s == pytest.approx(5 * MS)
    assert stats.body_s == pytest.approx((10 + (25 if listened else 0)) * MS)
    _adds_up(stats)


def test_waits_between_passes_stay_outside_after_the_next_pass() -> None:
    dev = FakeDevice()
    thr = dev.throttle(None, wait="spin", drain=False)
    for i in thr.wrap(range(10)):
        dev.launch(100 * MS)
        if i == 3:
            break
    thr.drain()  # outside the pass: the device is busy for 400 ms more
    assert thr.stats.wait_outside_s == pytest.approx(400 * MS, abs=1 * MS)
    for _ in thr.wrap(range(3)):  # the next pass: its own waits are inside
        dev.launch(10 * MS)
    thr.drain()  # outside again
    stats = thr.stats
    assert stats.wait_outside_s == pytest.approx(430 * MS, abs=1 * MS) and stats.wait_s == 0.0
    assert stats.waits == 2
    _adds_up(stats)
    with_depth = dev.throttle(1, wait="spin")
    for _ in with_depth.wrap(range(3)):
        dev.launch(10 * MS)
    assert with_depth.stats.wait_s == pytest.approx(30 * MS, abs=1 * MS)
    assert with_depth.stats.wait_outside_s == 0.0


class _Fetches:
    """A part that hears fetches: a step loop's time between steps reaches it as a fetch does."""

    def __init__(self) -> None:
        self.heard: list[tuple[int, float]] = []

    def on_fetch(self, step: int, start: float, seconds: float) -> None:
        self.heard.append((step, seconds))


def test_the_time_between_steps_is_heard_as_a_fetch_and_counted_apart() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    heard = _Fetches()
    thr.subscribe(heard)
    for _ in range(3):
        with thr.step():
            dev.host(2 * MS)
        dev.host(40 * MS)  # an evaluation between steps
    stats = thr.stats
    assert heard.heard == [(1, pytest.approx(40 * MS)), (2, pytest.approx(40 * MS))]
    # before: fetch_s 80 ms, and the verdict "input-bound" for a loop with no source to fetch from
    assert stats.fetch_s == 0.0 and stats.between_s == pytest.approx(80 * MS)
    assert stats.verdict == "host-bound"
    _adds_up(stats)


def test_a_frameworks_time_between_its_batches_is_fetching() -> None:
    from asyncthrottle.framework import ThrottleHooks

    dev = FakeDevice()
    hooks = ThrottleHooks(2, events=dev.event, wait=dev.wait("poll"), clock=dev.clock,
                          sample_every=None)
    for _ in range(4):
        # Lightning and the HF Trainer take (and move) the next batch between their step hooks; they
        # drain before an evaluation, so this gap is the framework's input
        dev.host(30 * MS)
        hooks.begin()
        dev.host(2 * MS)
        hooks.end()
    hooks.drain()
    stats = hooks.throttle.stats
    assert stats.fetch_s == pytest.approx(90 * MS) and stats.between_s == 0.0
    assert stats.verdict == "input-bound"
    _adds_up(stats)


def test_the_core_counts_and_tells_each_fetch_and_the_host_times_read_its_count() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    heard = _Fetches()
    thr.subscribe(heard)
    core = inside(thr).core
    core.fetched(3, 0.0, 5 * MS)
    core.fetched(4, 0.0, 7 * MS, counted=False)  # a step loop's time between steps: heard, not counted
    assert heard.heard == [(3, pytest.approx(5 * MS)), (4, pytest.approx(7 * MS))]
    assert core.fetch_s == inside(thr).host.fetch_s == pytest.approx(5 * MS)
    assert not hasattr(inside(thr).host, "fetched")  # the host times tell no notification of the core's
