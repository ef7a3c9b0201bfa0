"""Bad input, timeouts, Ctrl-C and misuse from threads: clear errors, no hangs."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


class NeverEvent:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return False

    def synchronize(self) -> None:
        raise AssertionError("a polling wait must not call synchronize()")


class _Stream:
    """What the throttle asks of a stream (torch.Stream's wait_stream and wait_event)."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("depth", "error", "message"),
    [
        (0, ValueError, "depth must be an int >= 1, 'auto', an AutoDepth or None, got 0"),
        (-3, ValueError, "got -3"),
        (1.5, TypeError, r"got 1.5 \(float\)"),
        (True, TypeError, r"got True \(bool\)"),
        ("2", ValueError, r"got '2' \(str\)"),
    ],
)
def test_bad_depth_names_the_rule_and_the_value(depth: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        at.Throttle(depth, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        at.throttle([1], depth=depth, device="cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"timeout": 0}, ValueError, "timeout must be a number of seconds > 0 or None, got 0"),
        ({"timeout": -1.0}, ValueError, "got -1.0"),
        ({"timeout": float("nan")}, ValueError, "got nan"),
        ({"timeout": "5"}, TypeError, "got '5'"),
        ({"wait": "fast"}, ValueError,
         r"wait must be one of \['auto', 'block', 'hybrid', 'poll', 'spin', 'spin-block'\]"),
        ({"wait": 3}, TypeError, "got int"),
        ({"wait": "block", "timeout": 1.0}, ValueError, "use wait='auto', 'hybrid', 'poll' or 'spin'"),
        ({"drain": "yes"}, TypeError, "drain must be True or False"),
        ({"device": "bogus"}, ValueError, "device='bogus' is not a device torch knows"),
        ({"device": 3}, TypeError, "device must be None, a str"),
        ({"device": "cpu", "streams": [_Stream()]}, ValueError, "the device is the CPU, which has no streams"),
        ({"events": 5}, TypeError, "events must be a zero-argument callable"),
        ({"events": NeverEvent, "device": "cpu"}, ValueError, "pass events= or device=/streams=, not both"),
    ],
)
def test_bad_options_name_the_argument_value_and_fix(options: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        at.Throttle(2, **options)  # type: ignore[arg-type]


def test_unavailable_explicit_device_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"device='cuda:1' was requested but is not available"):
        at.Throttle(2, device="cuda:1")


def test_non_iterable_source_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="needs an iterable such as a DataLoader, got int"):
        at.throttle(5, device="cpu")  # type: ignore[arg-type]


def test_timeout_names_the_step_and_leaves_the_throttle_usable() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, timeout=0.5)
    loop = iter(thr.wrap(range(3)))
    next(loop)
    dev.launch(10.0)
    with pytest.raises(at.ThrottleTimeout, match=r"step 0 did not complete .* timeout=0.5 s .*depth=1") as info:
        next(loop)
    assert isinstance(info.value, TimeoutError)
    assert info.value.step == 0 and info.value.depth == 1
    assert info.value.waited_s == pytest.approx(0.5)
    assert thr.stats.completed == 0 and thr.stats.steps == 1
    dev.host(10.0)  # the device catches up; the same throttle goes on
    assert list(thr.wrap(range(2))) == [0, 1]
    assert thr.stats.completed == 3


def test_spin_with_timeout_also_times_out_on_the_fake_clock() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=1, wait="spin", timeout=0.25)
    with thr.step():
        dev.launch(5.0)
    with pytest.raises(at.ThrottleTimeout), thr.step():
        pass


def test_keyboard_interrupt_arrives_in_a_polling_wait() -> None:
    waiting = threading.Event()

    class WatchedPoll(at.Poll):
        def __call__(self, event: Any, timeout: float | None, waited: float = 0.0) -> bool:
            waiting.set()
            return super().__call__(event, timeout, waited)

    thr = at.Throttle(1, events=NeverEvent, wait=WatchedPoll())

    def interrupt() -> None:
        waiting.wait()  # the loop has reached the wait, however slowly a busy machine got it there
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    # A suite started in the background (`cmd &`, nohup) inherits SIGINT ignored: Ctrl-C's handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):  # else the wait never ends: pytest-timeout fails the test
            for _ in thr.wrap(range(3)):  # the 2nd step blocks on a step that never completes
                pass
    finally:
        waiting.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert thr.stats.waits == 1  # the latency is a figure: python -m asyncthrottle bench overhead measures it


def test_a_second_thread_gets_an_error_not_a_race() -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth=2)
    loop = iter(thr.wrap(range(3)))
    next(loop)  # a wrapped loop is running in this thread
    errors: list[BaseException] = []

    def other() -> None:
        for call in (thr.mark, thr.drain, lambda: thr.step().__enter__(), lambda: list(thr.wrap([1]))):
            try:
                call()
            except RuntimeError as exc:
                errors.append(exc)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert len(errors) == 4
    assert all("thread" in str(e) for e in errors)
    assert list(loop) == [1, 2]  # the loop itself is unharmed


def test_mixing_the_wrapper_with_step_in_one_thread_is_an_error() -> None:
    thr = FakeDevice().throttle(depth=2)
    loop = iter(thr.wrap(range(3)))
    next(loop)
    with pytest.raises(RuntimeError, match="the wrapper already records and waits"):
        thr.mark()
    assert list(thr.wrap(range(2))) == [0, 1]  # a new pass in this thread ends the earlier one
    assert thr.stats.steps == 3  # the earlier pass's step was recorded when it ended
    with pytest.raises(RuntimeError, match="ended by a new loop over the same Throttle"):
        next(loop)  # asked for more: it was in use (nested or interleaved), never cut short silently
    loop.close()


def test_concurrent_step_from_two_threads_is_refused() -> None:
    release = threading.Event()
    entered = threading.Event()

    class GateEvent:
        def record(self) -> None:
            pass

        def query(self) -> bool:
            return release.is_set()

        def synchronize(self) -> None:
            entered.set()
            release.wait()

    thr = at.Throttle(1, events=GateEvent, wait="spin")
    with thr.step():
        pass
    thr.pause()  # the step loop's pass ends here: until then it keeps the throttle
    worker = threading.Thread(target=thr.drain)
    worker.start()
    entered.wait()
    try:
        with pytest.raises(RuntimeError, match=r"while thread .* is using this Throttle"):
            thr.mark()
    finally:
        release.set()
        worker.join()
    assert thr.in_flight == 0


def test_step_is_not_reentrant() -> None:
    thr = FakeDevice().throttle(depth=2)
    with thr.step(), pytest.raises(RuntimeError, match="not reentrant"), thr.step():
        pass


def test_a_timeout_pickles_and_copies_with_its_message_and_attributes() -> None:
    """A worker's error crosses a process pool (pickle) and copy.copy keeps it whole."""
    import copy
    import pickle

    error = at.ThrottleTimeout(7, 2, 0.5, 0.25)
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is at.ThrottleTimeout and isinstance(again, TimeoutError)
        assert str(again) == str(error)
        assert (again.step, again.depth, again.waited_s, again.timeout) == (7, 2, 0.5, 0.25)
