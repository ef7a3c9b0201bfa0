"""depth="auto": the controller, the body-idle the verdict now sees, and the edges of a real loop."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the loops of benchmarks/autodepth.py
from autodepth import drive, host_seconds

STEPS = 500


def _run(mode: int | str | None, loop: str, steps: int = STEPS, **options: Any) -> at.Throttle:
    """``loop`` (the benchmark's loops: 10 ms of device work per step) on the fake device under ``mode``."""
    dev = FakeDevice()
    thr = dev.throttle(mode, **options)
    drive(thr, loop, steps, host=dev.host, launch=dev.launch)
    return thr


def _fixed_rates(loop: str) -> dict[int, float]:
    return {depth: _run(depth, loop).stats.steps_per_s for depth in range(1, 9)}


def test_hiccup_loop_figures_are_the_issues() -> None:
    rates = _fixed_rates("hiccup")
    assert [round(rates[d]) for d in (1, 2, 3, 4, 5)] == [60, 77, 91, 100, 100]


def test_auto_reaches_the_best_fixed_depth_on_the_hiccup_loop_with_at_most_one_more_in_flight() -> None:
    rates = _fixed_rates("hiccup")
    best = max(rates.values())
    smallest = min(d for d, rate in rates.items() if rate >= 0.97 * best)
    auto = _run("auto", "hiccup").stats
    assert auto.steps_per_s >= 0.97 * best
    assert auto.max_in_flight <= smallest + 1
    assert auto.depth == 4 and auto.depth_changes == ((0, 2), (10, 3), (20, 4))  # two hiccups per raise
    assert auto.verdict == "device-bound"


@pytest.mark.parametrize("loop", ["device-bound", "host-bound"])
def test_auto_stays_at_two_on_steady_loops_at_no_loss(loop: str) -> None:
    best = max(_fixed_rates(loop).values())
    auto = _run("auto", loop).stats
    assert auto.max_in_flight <= 2 and auto.depth == 2 and auto.depth_changes == ((0, 2),)
    assert auto.steps_per_s >= 0.999 * best  # the fake clock's poll overshoot differs by depth, by < 0.01 %
    assert auto.steps_per_s == pytest.approx(_run(2, loop).stats.steps_per_s, rel=1e-12)


@pytest.mark.parametrize(
    ("mode", "loop", "expected"),
    [
        (2, "hiccup", "depth-bound"),  # 23 % idle opens inside the hiccup's body; 0 % of hand-outs starve
        (3, "hiccup", "depth-bound"),
        (4, "hiccup", "device-bound"),
        (2, "device-bound", "device-bound"),
        (2, "host-bound", "host-bound"),
        (1, "device-bound", "depth-bound"),
    ],
)
def test_verdict_sees_idle_inside_the_loop_body(mode: int, loop: str, expected: str) -> None:
    stats = _run(mode, loop).stats
    assert stats.verdict == expected
    if (mode, loop) == (2, "hiccup"):
        assert stats.starved_fraction < 0.01 and stats.dry_fraction == pytest.approx(0.2, abs=0.01)
        assert "try a larger depth" in stats.summary()


def test_depth_reports_the_current_choice_and_summary_the_history() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    seen = []
    for step in thr.wrap(range(40)):
        seen.append(thr.depth)
        dev.host(host_seconds("hiccup", step))
        dev.launch(0.010)
    assert seen[:10] == [2] * 10 and seen[10:20] == [3] * 10 and seen[20:] == [4] * 20  # from the changes' steps
    assert thr.stats.depth == 4 and "Throttle(depth=auto: 4" in repr(thr)
    text = thr.summary()
    assert "depth: auto, 2 (step 0) -> 3 (step 10) -> 4 (step 20)" in text
    flat = thr.stats.as_dict()
    assert flat["depth"] == 4 and flat["depth_changes"] == 2
    assert all(isinstance(v, (int, float, str)) for v in flat.values())


@pytest.mark.parametrize("max_depth", [1, 2, 3])
def test_max_depth_bounds_auto(max_depth: int) -> None:
    stats = _run(at.AutoDepth(max=max_depth), "hiccup").stats
    assert stats.depth == max_depth and stats.max_in_flight <= max_depth
    assert stats.depth_changes[0] == (0, min(2, max_depth))


def test_max_depth_above_need_is_not_reached() -> None:
    assert _run(at.AutoDepth(max=64), "hiccup").stats.depth == 4


def test_a_rare_hiccup_does_not_raise_the_depth() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    for step in thr.wrap(range(400)):
        dev.host(0.025 if step % 100 == 99 else 0.002)  # one slow body every 100 steps: never two in 64
        dev.launch(0.010)
    assert thr.depth == 2 and thr.stats.dry_fraction == pytest.approx(4 / 400)


def test_break_exception_and_second_pass_keep_the_depth_and_count_no_false_idle() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    for step in thr.wrap(range(100)):
        dev.host(host_seconds("hiccup", step))
        dev.launch(0.010)
        if step == 30:
            break
    assert thr.depth == 4 and thr.stats.steps == 31  # the break recorded the step it left
    with pytest.raises(ZeroDivisionError):
        for step in thr.wrap(range(100)):
            dev.launch(0.010)
            if step == 3:
                raise ZeroDivisionError
    assert thr.stats.steps == 31 + 4 and thr.depth == 4  # the step it left is recorded: its work was enqueued
    thr.drain()
    dry = thr.stats.dry_fraction * thr.stats.steps
    for _ in thr.wrap(range(20)):  # a second pass, device-bound: its first step starts on an idle queue
        dev.host(0.002)
        dev.launch(0.010)
    stats = thr.stats
    assert stats.depth == 4 and stats.dry_fraction * stats.steps == pytest.approx(dry)  # no new dry body
    assert stats.max_in_flight <= 4


def test_a_sync_in_the_body_keeps_auto_from_going_deeper_than_it_helps() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    previous = None
    for step in thr.wrap(range(60)):
        dev.host(host_seconds("hiccup", step))
        if previous is not None:
            assert previous.get() == step - 1  # host-device sync on the previous step, inside the body
        dev.launch(0.010)
        previous = thr.defer(float(step), name="x")
    # The hiccups still let the device run dry, but the body's sync keeps one step in flight: once the
    # queue is not full at the hand-outs, depth is not the bound and auto stops (max_depth would be 8).
    assert thr.stats.dry_fraction == pytest.approx(0.2) and thr.depth == 3 and thr.stats.max_in_flight == 2


def test_step_and_begin_step_loops_run_auto_too() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    for step in range(60):
        with thr.step():
            dev.host(host_seconds("hiccup", step))
            dev.launch(0.010)
    assert thr.depth == 4
    dev2 = FakeDevice()
    thr2 = dev2.throttle("auto")
    for step in range(60):  # a framework's hooks: begin_step/end_step, an iterator it never exhausts
        thr2.begin_step()
        dev2.host(host_seconds("hiccup", step))
        dev2.launch(0.010)
        thr2.end_step()
    assert thr2.depth == 4 and thr2.stats.max_in_flight <= 5


def test_timeout_in_a_wait_under_auto_raises_and_the_loop_goes_on() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto", wait="spin", timeout=0.005)  # spin: each fake-clock read moves it on
    it = iter(thr.wrap(range(10)))
    next(it)
    dev.launch(1.0)  # step 0 takes a second
    next(it)
    dev.launch(0.001)
    with pytest.raises(at.ThrottleTimeout):
        next(it)  # depth 2: step 2 waits for step 0, longer than the timeout
    dev.host(1.0)
    assert next(it) == 2 and thr.depth == 2  # the kept batch is handed out; one timeout is no strike


def test_drain_waits_are_no_strike() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    for _ in range(5):  # host-bound passes: the only waits are drains; every body is dry
        for _ in thr.wrap(range(10)):
            dev.host(0.020)
            dev.launch(0.010)
    assert thr.depth == 2 and thr.stats.waits >= 5


def test_stats_are_readable_from_another_thread() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    drive(thr, "hiccup", 40, host=dev.host, launch=dev.launch)
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.append((thr.depth, thr.stats.depth_changes)))
    reader.start()
    reader.join()
    assert seen == [(4, ((0, 2), (10, 3), (20, 4)))]


def test_auto_on_a_synchronous_backend_and_through_throttle() -> None:
    view = at.throttle(range(5), depth="auto", device="cpu")
    assert list(view) == [0, 1, 2, 3, 4]
    assert view.stats.depth == 2 and view.stats.depth_changes == ((0, 2),) and view.stats.waits == 0


def test_fixed_depth_has_no_history() -> None:
    stats = _run(2, "device-bound", steps=20).stats
    assert stats.depth == 2 and stats.depth_changes == () and "depth: auto" not in stats.summary()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"depth": "Auto"}, ValueError, r"depth='Auto': write it depth='auto'"),
        ({"depth": "fast"}, ValueError, r"int >= 1, 'auto', an AutoDepth or None, got 'fast' \(str\)"),
        ({"depth": at.AutoDepth(max=4), "max_depth": 8}, ValueError,
         r"max_depth=8 and depth=AutoDepth\(max=4\) both set the cap; drop max_depth"),
        ({"depth": "auto", "max_depth": 0}, ValueError, r"max_depth must be an int >= 1.*got 0"),
        ({"depth": "auto", "max_depth": 2.5}, TypeError, r"max_depth must be an int >= 1.*got 2.5"),
        ({"depth": "auto", "max_depth": True}, TypeError, r"max_depth must be an int >= 1.*got True"),
        ({"depth": 3, "max_depth": 8}, ValueError, r"max_depth=8 applies to depth='auto' only, but depth=3"),
        ({"depth": None, "max_depth": 8}, ValueError, r"max_depth=8 applies to depth='auto' only, but depth=None"),
    ],
)
def test_bad_auto_options_name_the_argument_and_the_fix(options: dict[str, Any], error: type, match: str) -> None:
    dev = FakeDevice()
    depth = options.pop("depth")
    with pytest.raises(error, match=match):
        dev.throttle(depth, **options)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: at.AutoDepth(max=0), ValueError, r"AutoDepth max must be an int >= 1 .*got 0"),
        (lambda: at.AutoDepth(max=2.5), TypeError, r"AutoDepth max must be an int >= 1 .*got 2.5"),
        (lambda: at.AutoDepth(max=True), TypeError, r"got True"),
        (lambda: at.AutoDepth(max=None), TypeError, r"AutoDepth max must be an int >= 1 .*got None"),
        (lambda: at.AutoDepth(4), TypeError, r"positional"),  # keyword-only, as every option
    ],
)
def test_a_bad_auto_depth_is_refused_where_it_is_made(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_auto_is_auto_depth_with_its_defaults() -> None:
    assert at.AutoDepth() == at.AutoDepth(max=8) and repr(at.AutoDepth(max=3)) == "AutoDepth(max=3)"
    auto, default = _run("auto", "hiccup").stats, _run(at.AutoDepth(), "hiccup").stats
    assert auto.depth_changes == default.depth_changes and auto.depth == default.depth == 4
    assert "Throttle(depth=auto: 2" in repr(FakeDevice().throttle(at.AutoDepth(max=3)))


def test_max_depth_still_works_and_warns_at_the_users_line() -> None:
    deprecated = r"max_depth=3 is deprecated .*depth=asyncthrottle\.AutoDepth\(max=3\)"
    with pytest.warns(DeprecationWarning, match=deprecated) as caught:
        thr = (dev := FakeDevice()).throttle("auto", max_depth=3)
    assert caught[0].filename == __file__
    drive(thr, "hiccup", STEPS, host=dev.host, launch=dev.launch)
    assert thr.stats.depth == 3 and thr.stats.depth_changes[-1][1] == 3  # the cap it gave, as AutoDepth(max=3)


@pytest.mark.slow
def test_mnist_example_takes_depth_auto() -> None:
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    mnist = pytest.importorskip("mnist")
    args = mnist.parse_args(["--depth", "auto", "--data", "synthetic", "--device", "cpu", "--no-progress",
                             "--max-steps", "8", "--epochs", "1", "--batch-size", "32"])
    assert args.depth == "auto"
    lines: list[str] = []
    result = mnist.train(args, log=lines.append)
    assert result["stats"].steps == 8 and result["stats"].depth_changes == ((0, 2),)
    assert any("depth=auto" in line for line in lines)


def test_a_second_thread_cannot_drive_an_auto_throttle_mid_loop() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    errors: list[BaseException] = []

    def intrude() -> None:
        try:
            thr.begin_step()
        except RuntimeError as exc:
            errors.append(exc)

    for step in thr.wrap(range(30)):
        dev.host(host_seconds("hiccup", step))
        dev.launch(0.010)
        if step == 12:
            other = threading.Thread(target=intrude)
            other.start()
            other.join()
    assert len(errors) == 1 and thr.depth == 4 and thr.stats.steps == 30


def test_a_long_hiccup_ramps_auto_to_max_depth_one_step_per_two_dry_bodies() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    for step in thr.wrap(range(200)):
        dev.host(0.060 if step % 8 == 7 else 0.002)  # needs about 7 steps queued
        dev.launch(0.010)
    changes = thr.stats.depth_changes
    assert [depth for _, depth in changes] == [2, 3, 4, 5, 6, 7, 8] and thr.stats.max_in_flight == 8
    assert [step for step, _ in changes][1:] == [16, 32, 48, 64, 80, 96]  # every second hiccup
