"""The edges a real loop hits: break, passes, time between passes, timeouts, Ctrl-C, failing timing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


def _values_by_step(thr: at.Throttle) -> list[tuple[int, dict[str, Any]]]:
    seen: list[tuple[int, dict[str, Any]]] = []
    thr.on_complete(lambda step, values: seen.append((step, dict(values))))
    return seen


@pytest.mark.parametrize("depth", [1, 2, None])
def test_break_records_the_step_it_leaves_and_its_values_arrive_with_it(depth: int | None) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth)
    seen = _values_by_step(thr)
    for i in thr.wrap(range(10)):
        dev.launch(0.010)
        thr.defer(i * 1.0, name="loss")
        if i == 2:
            break
    assert thr.stats.steps == 3  # steps 0, 1 and the one broken out of
    assert dev.syncs == 0 or depth == 1  # the break itself never blocks
    thr.drain()
    assert seen == [(0, {"loss": 0.0}), (1, {"loss": 1.0}), (2, {"loss": 2.0})]
    for i in thr.wrap(range(2)):  # a second pass: its values are its own
        dev.launch(0.010)
        thr.defer(100.0 + i)
    assert seen[3:] == [(3, {"value": 100.0}), (4, {"value": 101.0})]  # not 'value_1', not a stale loss


def test_break_inside_a_function_and_a_return_record_too() -> None:
    thr = at.Throttle(2, device="cpu")

    def first_two() -> list[int]:
        out = []
        for i in thr.wrap(range(10)):
            out.append(i)
            if i == 1:
                return out
        return out

    assert first_two() == [0, 1]
    assert thr.stats.steps == 2
    for i, _ in enumerate(thr.wrap(range(10))):
        if i == 0:
            break
    assert thr.stats.steps == 3


def test_an_exception_in_the_body_records_the_step_it_leaves_with_its_values() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    seen = _values_by_step(thr)
    with pytest.raises(KeyError):
        for i in thr.wrap(range(10)):
            dev.launch(0.010)
            thr.defer(float(i), name="loss")
            if i == 2:
                raise KeyError("in the body")
    assert thr.stats.steps == 3 and dev.syncs == 0  # its work was enqueued: step 2 is recorded, never waited for
    for _ in thr.wrap(range(1)):
        thr.defer(7.0, name="loss")
    assert seen == [(0, {"loss": 0.0}), (1, {"loss": 1.0}), (2, {"loss": 2.0}), (3, {"loss": 7.0})]


def test_a_new_pass_ends_a_referenced_unfinished_one_and_restores_the_sync_mode(
    fake_cuda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    mode = {"value": 0}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["value"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(value=m))
    thr = at.Throttle(2, device="cuda", detect_sync="warn")
    loop = iter(thr.wrap(range(5)))
    for _ in loop:
        thr.defer(1.0, name="loss")
        break  # `loop` is still referenced: the pass is not closed
    assert mode["value"] == "warn"
    assert list(thr.wrap(range(2))) == [0, 1]  # not refused: the earlier pass is ended
    assert mode["value"] == 0
    assert thr.stats.steps == 3 and thr.latest == {"loss": 1.0}


def test_stats_count_time_inside_passes_only_and_are_never_negative() -> None:
    dev = FakeDevice()
    dev.clock.advance(1285.1)  # a clock far from zero: stats during step 0 must not be negative
    thr = dev.throttle(2, wait="spin", sample_every=None)
    for _ in thr.wrap(range(4)):
        assert thr.stats.wall_s >= 0 and thr.stats.body_s >= 0
        dev.launch(0.010)
        dev.host(0.002)
    dev.host(5.0)  # an evaluation between epochs: not loop time
    for _ in thr.wrap(range(4)):
        dev.launch(0.010)
        dev.host(0.002)
    s = thr.stats
    assert s.wall_s == pytest.approx(2 * 0.040)  # each pass: 4 x 10 ms on the device, drained at the end
    assert s.steps_per_s == pytest.approx(8 / 0.080)
    assert s.verdict == "device-bound"
    assert min(s.wall_s, s.body_s, s.fetch_s, s.wait_s) >= 0


def test_step_loops_end_their_pass_at_drain() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", sample_every=None)
    for _ in range(3):
        with thr.step():
            dev.launch(0.010)
    thr.drain()
    dev.host(10.0)  # validation: not loop time
    with thr.step():
        dev.launch(0.010)
    thr.drain()
    assert thr.stats.wall_s == pytest.approx(0.040)


def test_a_timeout_in_the_wrapped_loop_keeps_the_fetched_batch() -> None:
    dev = FakeDevice()
    fetched: list[int] = []

    def source() -> Iterator[int]:
        for i in range(4):
            fetched.append(i)
            yield i

    thr = dev.throttle(1, timeout=0.005, sample_every=None)
    loop = iter(thr.wrap(source()))
    assert next(loop) == 0
    dev.launch(0.020)  # step 0 takes 20 ms on the device
    with pytest.raises(at.ThrottleTimeout):
        next(loop)  # waits 5 ms for step 0, gives up
    assert fetched == [0, 1]
    dev.host(0.020)  # meanwhile, step 0 completes
    assert next(loop) == 1  # the batch fetched before the timeout is handed out
    assert fetched == [0, 1] and thr.stats.steps == 1
    assert list(loop) == [2, 3]
    assert thr.stats.steps == 4


def test_ctrl_c_in_the_wait_keeps_the_fetched_batch() -> None:
    class Interrupting:
        calls = 0
        blocking_events = False
        honours_timeout = True

        def __call__(self, event: Any, timeout: float | None) -> bool:
            Interrupting.calls += 1
            if Interrupting.calls == 1:
                raise KeyboardInterrupt
            event.synchronize()
            return True

    dev = FakeDevice()
    thr = at.Throttle(1, events=dev.event, wait=Interrupting(), clock=dev.clock)
    loop = iter(thr.wrap(range(3)))
    next(loop)
    dev.launch(0.010)
    with pytest.raises(KeyboardInterrupt):
        next(loop)
    assert list(loop) == [1, 2]


class _UntimedEvent:
    """Like ``torch.cuda.Event()`` with its default ``enable_timing=False``: elapsed_time raises."""

    def __init__(self, dev: FakeDevice) -> None:
        self._event = dev.event()

    def record(self) -> None:
        self._event.record()

    def query(self) -> bool:
        return self._event.query()

    def synchronize(self) -> None:
        self._event.synchronize()

    def elapsed_time(self, end: Any) -> float:
        raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")


def test_events_without_timing_turn_timing_off_and_lose_nothing(caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice()
    thr = at.Throttle(2, events=lambda: _UntimedEvent(dev), wait=dev.wait("spin"), clock=dev.clock)
    seen = _values_by_step(thr)
    for i in thr.wrap(range(20)):
        dev.launch(0.001)
        thr.defer(float(i), name="loss")
    assert [step for step, _ in seen] == list(range(20))
    assert [values["loss"] for _, values in seen] == [float(i) for i in range(20)]
    assert thr.stats.device_samples == 0 and "not timed" in thr.summary()
    assert "device timing is off" in caplog.text


def test_same_name_twice_in_a_step_keeps_every_value_in_order() -> None:
    thr = at.Throttle(2, device="cpu")
    seen = _values_by_step(thr)
    for step in thr.wrap(range(2)):
        for micro in range(3):  # gradient accumulation
            thr.defer(10.0 * step + micro, name="loss")
        thr.defer(0.5, name="lr")
    assert seen == [(0, {"loss": [0.0, 1.0, 2.0], "lr": 0.5}), (1, {"loss": [10.0, 11.0, 12.0], "lr": 0.5})]
    assert thr.latest["loss"] == [10.0, 11.0, 12.0]


def test_callbacks_can_be_removed() -> None:
    thr = at.Throttle(2, device="cpu")
    calls: list[int] = []
    callback = thr.on_complete(lambda step, values: calls.append(step))
    for _ in thr.wrap(range(2)):
        pass
    thr.remove_on_complete(callback)
    for _ in thr.wrap(range(2)):
        pass
    assert calls == [0, 1]
    with pytest.raises(ValueError, match="not registered"):
        thr.remove_on_complete(callback)


def test_a_failing_callback_does_not_lose_the_step() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1)
    good: list[int] = []
    thr.on_complete(lambda step, values: good.append(step))

    def bad(step: int, values: dict[str, Any]) -> None:
        if step == 1:
            raise ValueError("a bug in the user's logger")

    thr.on_complete(bad)
    loop = iter(thr.wrap(range(4)))
    for _ in range(2):
        next(loop)
        dev.launch(0.001)
    with pytest.raises(ValueError, match="user's logger"):
        next(loop)  # step 1 retires while step 2 is admitted
    assert list(loop) == [2, 3]  # the batch was kept; nothing lost
    assert good == [0, 1, 2, 3]


def test_a_wait_class_instead_of_an_instance_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"wait=Poll is a class; pass an instance such as wait=Poll\(\)"):
        at.Throttle(2, device="cpu", wait=at.Poll)  # type: ignore[arg-type]


def test_synchronous_verdict_gives_no_gpu_advice() -> None:
    thr = at.Throttle(2, device="cpu")
    for _ in thr.wrap(range(50)):
        sum(range(2000))  # the body is the computation
    s = thr.stats
    assert s.verdict == "synchronous"
    assert "CUDA" not in thr.summary() and "torch.compile" not in thr.summary()
