"""One loop, one thread; reads and deferred values from any thread, with gated events (no sleeps)."""

from __future__ import annotations

import collections
import threading
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


class Gate:
    """Events that complete only when the test opens their gate; notes which threads found one pending."""

    def __init__(self) -> None:
        self.gates: collections.defaultdict[int, threading.Event] = collections.defaultdict(threading.Event)
        self.made = 0
        self.blocked: set[int] = set()  # threads that queried or waited on a pending event
        self.changed = threading.Condition()

    def __call__(self) -> GatedEvent:
        self.made += 1
        return GatedEvent(self.gates[self.made - 1], self)

    def open(self, index: int) -> None:
        """Complete the ``index``-th event made (made or not yet)."""
        self.gates[index].set()

    def note(self) -> None:
        with self.changed:
            self.blocked.add(threading.get_ident())
            self.changed.notify_all()

    def wait_for_thread(self, thread: threading.Thread) -> None:
        """Return once ``thread`` has found an event pending (it is in a wait)."""
        with self.changed:
            assert self.changed.wait_for(lambda: thread.ident in self.blocked, timeout=30)


class GatedEvent:
    def __init__(self, gate: threading.Event, owner: Gate) -> None:
        self.gate, self.owner = gate, owner

    def record(self) -> None:
        pass

    def query(self) -> bool:
        if self.gate.is_set():
            return True
        self.owner.note()
        return False

    def synchronize(self) -> None:
        if not self.gate.is_set():
            self.owner.note()
        assert self.gate.wait(timeout=30), "gate never opened"


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_get_from_another_thread_waits_on_its_own_step_and_changes_nothing() -> None:
    gate = Gate()
    thr = at.Throttle(None, events=gate, wait="spin", sample_every=None)
    loop = iter(thr.wrap(range(4)))
    deferred = []
    for _ in range(3):
        next(loop)
        deferred.append(thr.defer(len(deferred) * 1.0, name="loss"))
    next(loop)  # steps 0..2 recorded, all pending
    thread, out = _in_thread(deferred[1].get)  # a logging thread reads step 1's loss
    gate.wait_for_thread(thread)
    gate.open(0)
    assert thread.is_alive()  # step 0 done is not enough
    before = (thr.stats.completed, thr.stats.steps, thr.stats.waits)
    gate.open(1)
    thread.join(timeout=30)
    assert out == [1.0]
    assert (thr.stats.completed, thr.stats.steps, thr.stats.waits) == before == (0, 3, 0)  # mutated nothing
    assert not deferred[2].ready() and deferred[1].ready() and deferred[0].ready()
    gate.open(2)
    gate.open(3)
    assert list(loop) == []
    s = thr.stats
    assert s.completed == s.steps == 4 and s.in_flight == 0 and thr.latest == {"loss": 2.0}


def test_get_on_the_loop_thread_retires_in_order_and_counts_the_wait() -> None:
    dev = FakeDevice()
    thr = dev.throttle(None, wait="spin", sample_every=None)
    got: list[int] = []
    thr.on_complete(lambda step, values: got.append(step))
    loop = iter(thr.wrap(range(3)))
    next(loop)
    dev.launch(0.010)
    first = thr.defer(5.0)
    next(loop)
    assert not first.ready()
    assert first.get() == 5.0 and got == [0]  # waited for step 0 only, and delivered it
    assert thr.stats.waits == 1 and thr.stats.wait_s == pytest.approx(0.010)


def test_reads_from_another_thread_during_waits_are_consistent() -> None:
    dev = FakeDevice()  # events complete when waited for
    thr = dev.throttle(1, wait="spin", sample_every=1)
    snapshots: list[at.Stats] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            snapshots.append(thr.stats)
            _ = thr.in_flight, thr.latest

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in thr.wrap(range(200)):
            dev.launch(0.001)
            thr.defer(float(i), name="loss")
    finally:
        stop.set()
        thread.join()
    assert snapshots
    for s in snapshots:
        assert 0 <= s.completed <= s.steps and 0 <= s.in_flight <= 1 and s.wall_s >= 0
    assert thr.stats.completed == 200 and thr.latest == {"loss": 199.0}


def test_a_loop_cannot_start_while_another_thread_drains() -> None:
    gate = Gate()
    thr = at.Throttle(2, events=gate, wait="spin", sample_every=None)
    with thr.step():
        pass
    thr.pause()  # the step loop's pass ends: another thread may drain
    thread, out = _in_thread(thr.drain)
    gate.wait_for_thread(thread)
    try:
        with pytest.raises(RuntimeError, match="is using this Throttle"):
            next(iter(thr.wrap(range(3))))
        with pytest.raises(RuntimeError, match="is using this Throttle"):
            thr.begin_step()
    finally:
        gate.open(0)
        thread.join(timeout=30)
    assert out == [None]
    gate.open(1)
    gate.open(2)
    assert list(thr.wrap(range(2))) == [0, 1]  # usable once the drain is over
    assert thr.stats.steps == 3


def test_drain_from_another_thread_during_a_loop_is_refused() -> None:
    gate = Gate()
    thr = at.Throttle(2, events=gate, wait="spin", sample_every=None)
    loop = iter(thr.wrap(range(3)))
    next(loop)
    thread, out = _in_thread(thr.drain)
    thread.join(timeout=30)
    assert isinstance(out[0], RuntimeError) and "thread" in str(out[0])
    for i in range(4):
        gate.open(i)
    assert list(loop) == [1, 2]


def test_close_from_another_thread_while_a_step_loop_runs_is_refused() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    thr.begin_step()
    refused = _joined(thr.close)
    assert isinstance(refused, RuntimeError) and "close() was called while thread" in str(refused)
    thr.end_step()
    thr.close()


def _joined(call: Any) -> Any:
    """``call()`` in another thread, joined: what it returned or raised."""
    thread, out = _in_thread(call)
    thread.join(timeout=30)
    assert not thread.is_alive()
    return out[0]


@pytest.mark.parametrize("call", ["end_step", "begin_step", "drain", "mark", "pause"])
def test_a_step_loop_keeps_its_throttle_during_and_between_steps(call: str) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    told: list[int] = []
    thr.on_complete(lambda step, values: told.append(threading.get_ident()))
    for _ in range(2):
        with thr.step():
            dev.launch(0.010)
            thr.defer(1.0)
    thr.begin_step()
    during = _joined(getattr(thr, call))  # the loop is in its step
    thr.end_step()
    between = _joined(getattr(thr, call))  # the loop is between two steps
    for refused in (during, between):
        assert isinstance(refused, RuntimeError) and "is using this Throttle" in str(refused), refused
    assert thr.stats.steps == 3 and told == [threading.get_ident()] * len(told)  # callbacks on the loop's thread only
    thr.drain()  # ends the loop's pass: now another thread may use the throttle
    assert told == [threading.get_ident()] * 3
    assert _joined(thr.pause) is None and _joined(lambda: thr.step().__enter__()) == 3


def test_a_step_loop_left_by_a_thread_that_ended_does_not_keep_the_throttle() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)

    def train() -> None:
        for _ in range(3):
            with thr.step():
                dev.launch(0.010)

    assert _joined(train) is None  # a worker's loop that never drained
    thr.drain()  # its thread has ended: its claim is void
    assert thr.stats.completed == 3
    with thr.step():
        pass
    assert isinstance(_joined(thr.drain), RuntimeError)  # and this thread's loop keeps it in turn
