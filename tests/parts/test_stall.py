"""The stall report: once per stalled wait, on time, naming the step; never a sync; the loop goes on."""

from __future__ import annotations

import gc
import logging
import threading
import time
import types
import weakref
from typing import ClassVar

import pytest
from helpers import inside

import asyncthrottle as at
import asyncthrottle.parts.stall as stall_module
from asyncthrottle.parts.stall import STALL_FLOOR_S, StallWatch, check_stall
from asyncthrottle.testing import FakeDevice

STEP_S = 0.01


def _run(dev: FakeDevice, thr: at.Throttle, steps: int, stuck: dict[int, float]) -> None:
    for i in thr.wrap(range(steps)):
        dev.launch(stuck.get(i, STEP_S))


def _reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]


@pytest.mark.parametrize("wait", ["poll", "hybrid"])
def test_a_stopped_device_is_reported_once_on_time_and_the_loop_goes_on(
    wait: str, caplog: pytest.LogCaptureFixture
) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=2, wait=wait, stall=5.0)
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        _run(dev, thr, 20, {6: 100.0})  # step 6 takes 100 s: the device "stops" for that long
    (report,) = _reports(caplog)
    waited = float(report.split("waited ")[1].split(" s")[0])
    assert 5.0 <= waited <= 6.0  # within stall + 1 s
    assert "for step 6 " in report and "steps in flight (steps 6..7)" in report
    assert "Thread MainThread" in report and "test_stall.py" in report  # the loop's own line is in the stack
    assert "asyncthrottle/stall.py" not in report  # the report's own frames are left out
    stats = thr.stats
    assert (stats.stalls, stats.steps, stats.completed) == (1, 20, 20)  # unharmed once the device resumes
    assert "stalls: 1 waits reported" in thr.summary()


class _Queries:
    """Counts the device queries made during each wait."""

    def __init__(self, dev: FakeDevice) -> None:
        self.dev, self.per_wait, self._before = dev, {}, 0

    def on_wait_begin(self, step: int) -> None:
        self._before = self.dev.queries

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        self.per_wait[step] = self.dev.queries - self._before


def test_the_report_adds_no_sync_and_one_wake_up_at_most() -> None:
    seen = []
    for stall in (None, 5.0):
        dev = FakeDevice()
        thr = dev.throttle(depth=2, wait="poll", stall=stall)
        queries = _Queries(dev)
        thr.subscribe(queries)
        _run(dev, thr, 20, {6: 100.0})
        seen.append((dev.records, dev.syncs, queries.per_wait[6]))
    (records, syncs, off), (records_on, syncs_on, on) = seen
    assert (records, syncs) == (records_on, syncs_on) and syncs == 0
    assert off <= on <= off + 1  # the wait woke once more: at the report, which it resumed from


def test_timeout_still_decides_and_a_retry_is_not_reported_again(caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="poll", stall=2.0, timeout=5.0)
    view = iter(thr.wrap(range(4)))
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        next(view)
        dev.launch(12.0)
        with pytest.raises(at.ThrottleTimeout):
            next(view)
        assert 5.0 <= dev.clock() < 5.1 and len(_reports(caplog)) == 1
        with pytest.raises(at.ThrottleTimeout):
            next(view)  # the same stall, retried: no second report
        next(view)  # the device caught up at 12 s
    assert len(_reports(caplog)) == 1 and thr.stats.stalls == 1


def test_a_timeout_shorter_than_stall_raises_without_a_report(caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="hybrid", stall=10.0, timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"), pytest.raises(at.ThrottleTimeout):
        _run(dev, thr, 3, {0: 5.0})
    assert not _reports(caplog)


def test_auto_has_a_floor_and_grows_with_the_step_time(caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="poll")  # stall="auto" is the default
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        _run(dev, thr, 30, {20: STALL_FLOOR_S - 5})  # a slow step under the floor: no report
        assert not _reports(caplog)
        _run(dev, thr, 30, {20: STALL_FLOOR_S + 5})
        assert len(_reports(caplog)) == 1
    slow = FakeDevice()
    thr = slow.throttle(depth=1, wait="poll")
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        _run(slow, thr, 30, {i: 1.0 for i in range(30)} | {25: 45.0})  # 1 s steps: auto = 50 s
    watch = inside(thr).part(StallWatch)
    assert thr.stats.stalls == 0 and watch is not None and watch.threshold() == pytest.approx(50.0, rel=0.01)


def test_auto_comes_back_to_the_floor_once_the_slow_steps_leave_its_window() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="poll")
    watch = inside(thr).part(StallWatch)
    assert watch is not None
    _run(dev, thr, 40, {i: 2.0 for i in range(40)})  # 2 s steps: auto = 100 s
    assert watch.threshold() == pytest.approx(100.0, rel=0.01)
    _run(dev, thr, 12, {i: 0.5 for i in range(12)})  # 0.5 s steps: 25 s, under the floor
    # (at most half of the window is slow: the median is a fast one)
    assert watch.threshold() == STALL_FLOOR_S
    _run(dev, thr, 40, {i: 0.7 for i in range(40)})  # 0.7 s steps: 35 s, over it again
    assert watch.threshold() == pytest.approx(35.0, rel=0.01)


def test_none_turns_it_off_and_a_synchronous_backend_has_nothing_to_watch() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="poll", stall=None)
    _run(dev, thr, 5, {2: 1000.0})
    assert thr.stats.stalls == 0 and inside(thr).part(StallWatch) is None
    assert inside(at.Throttle(device="cpu", stall=1.0)).part(StallWatch) is None


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [(0, ValueError, "got 0"), (-1.0, ValueError, "> 0"), (float("nan"), ValueError, "nan"),
     (float("inf"), ValueError, "finite"), (True, TypeError, "True"), ("Auto", ValueError, "stall='auto'"),
     ("soon", ValueError, "'soon'"), ([1], TypeError, r"\[1\]")],
)
def test_bad_values_say_the_rule(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_stall(value)
    with pytest.raises(error, match="stall must be"):
        FakeDevice().throttle(stall=value)


class _HeldEvent:
    """An event whose synchronize() holds the thread until released, like a driver wait; logs callers."""

    release: ClassVar[threading.Event] = threading.Event()
    callers: ClassVar[set[int]] = set()

    def record(self) -> None:
        self.callers.add(threading.get_ident())

    def query(self) -> bool:
        self.callers.add(threading.get_ident())
        return self.release.is_set()

    def synchronize(self) -> None:
        self.callers.add(threading.get_ident())
        self.release.wait()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("wait", ["spin", "block"])
def test_a_wait_held_in_the_driver_is_reported_by_a_watchdog_that_never_touches_the_event(
    wait: str, caplog: pytest.LogCaptureFixture
) -> None:
    _HeldEvent.release, _HeldEvent.callers = threading.Event(), set()
    thr = at.Throttle(1, events=_HeldEvent, wait=wait, stall=0.3, sample_every=None)
    timer = threading.Timer(1.6, _HeldEvent.release.set)
    start = time.perf_counter()
    timer.start()
    with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
        for _ in thr.wrap(range(3)):
            pass
    timer.join()
    (report,) = _reports(caplog)
    assert "for step 0 " in report and "_HeldEvent" not in report.split("\n")[0]
    assert "synchronize" in report  # the loop's thread is seen blocked in the event's synchronize()
    reported_at = caplog.records[-1].created - (start + time.time() - time.perf_counter())
    assert 0.3 <= reported_at <= 1.3 + 0.3  # stall + the watchdog's half-second period (+ slack for load)
    assert _HeldEvent.callers == {threading.get_ident()}  # only the loop's thread touched the events
    assert thr.stats.stalls == 1 and thr.stats.completed == 3


def test_check_from_another_thread_reads_counters_only() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=2, wait="poll", stall=2.0)
    watch = inside(thr).part(StallWatch)
    assert isinstance(watch, StallWatch)
    assert not watch.look()  # no wait running
    watch.on_wait_begin(0)
    dev.clock.advance(1.0)
    assert not watch.look()
    dev.clock.advance(1.5)
    queries = dev.queries
    assert watch.look() and not watch.look()  # once
    assert dev.queries == queries


class _Payload:
    """Stands in for a tensor the loop body holds."""


def _loop_with_a_stall_then_break(dev: FakeDevice, thr: at.Throttle) -> weakref.ref[_Payload]:
    kept = None
    for i, _ in enumerate(thr.wrap(range(10))):
        kept = _Payload()
        dev.launch(5.0)  # 5 s of device work per step; stall=1 s: the depth-1 wait is reported
        if i == 4:
            break
    return weakref.ref(kept)


@pytest.mark.parametrize("wait", ["poll", "hybrid"])
def test_a_report_on_the_loops_thread_does_not_pin_the_loop(wait: str, caplog: pytest.LogCaptureFixture) -> None:
    gc.collect()
    gc.disable()  # only reference counts free the pass: a cycle would keep it
    try:
        dev = FakeDevice()
        thr = dev.throttle(1, wait=wait, stall=1.0)
        with caplog.at_level(logging.WARNING, logger="asyncthrottle"):
            ref = _loop_with_a_stall_then_break(dev, thr)
        assert thr.stats.stalls >= 1 and _reports(caplog)  # the report ran on the loop's thread
        assert thr.stats.steps == 5  # the break recorded its step: the pass was let go
        thr.begin_step()  # no "inside a wrapped loop": the pass is gone
        thr.end_step()
        assert ref() is None  # the loop's locals went with its frame
    finally:
        gc.enable()
        gc.collect()


def _watchdogs() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "asyncthrottle-stall-watchdog" and t.is_alive()}


@pytest.mark.parametrize("wait", ["spin", "block"])
def test_dropped_throttles_leave_no_watchdog_thread_behind(wait: str) -> None:
    gc.collect()
    gc.disable()  # (a dropped throttle is freed by reference counts alone; a thread per watch would stay)
    try:
        watches = []
        for _ in range(20):
            dev = FakeDevice()
            thr = dev.throttle(1, wait=wait)  # stall="auto": a wait held in the driver needs the watchdog
            for _ in thr.wrap(range(3)):
                dev.launch(0.010)  # depth 1: every step waits
            watch = inside(thr).part(StallWatch)
            assert watch is not None and watch._watchdog
            watches.append(weakref.ref(watch))
            del dev, thr, watch
        assert len(_watchdogs()) <= 1  # one thread for the process, however many throttles were made
        gc.enable()
        gc.collect()
        assert all(ref() is None for ref in watches)  # the thread holds no watch between waits
    finally:
        gc.enable()
        gc.collect()


def test_the_watchdog_lets_go_of_a_watch_between_waits_without_a_lock_on_the_loops_side() -> None:
    from asyncthrottle.parts.stall import _Watchdog

    dev = FakeDevice()
    thr = dev.throttle(1, wait="block", stall=5.0)
    watch = inside(thr).part(StallWatch)
    assert watch is not None and watch._watchdog
    dog = _Watchdog()
    dog._thread = threading.current_thread()  # alive: begin() starts no thread here
    calls: list[StallWatch] = []
    real = stall_module._WATCHDOG
    # the loop's calls into the watchdog are recorded, then passed on to this one
    stall_module._WATCHDOG = types.SimpleNamespace(  # type: ignore[assignment]
        begin=lambda w: (calls.append(w), dog.begin(w)))
    try:
        watch.on_wait_begin(0)  # a wait on a watch not held: added, under the lock
        assert calls == [watch] and watch._watched and dog._sweep() == [watch]  # waiting: looked at
        watch.on_wait(0, 0.0, 0.1)
        assert dog._sweep() == [] and not watch._watched and len(dog._watches) == 0  # let go
        watch.on_wait_begin(1)
        assert calls == [watch, watch]  # not held any more: the loop adds it again
        watch.on_wait(1, 0.0, 0.1)
        watch.on_wait_begin(2)
        assert len(calls) == 2  # still held (no look since): a wait costs no call, no lock
        watch.on_wait(2, 0.0, 0.1)
        # a sweep between the loop's store of _waiting and its read of _watched keeps the watch
        watch._waiting = (3, 0.0, 5.0)  # the first half of on_wait_begin
        assert dog._sweep() == [watch] and watch._watched  # kept: the loop then skips begin()
    finally:
        stall_module._WATCHDOG = real
