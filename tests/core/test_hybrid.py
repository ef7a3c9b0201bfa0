"""The hybrid wait on the fake device: it learns the wait, sleeps, then spins briefly; timeouts, validation."""

from __future__ import annotations

import pytest

from asyncthrottle.core.waits import Hybrid, Poll, Spin, resolve_wait
from asyncthrottle.testing import FakeClock, FakeDevice


class NeverEvent:
    """An event that never completes; counts queries."""

    def __init__(self) -> None:
        self.queries = 0

    def record(self) -> None:
        pass

    def query(self) -> bool:
        self.queries += 1
        return False

    def synchronize(self) -> None:
        raise AssertionError("hybrid never calls synchronize()")


class Naps:
    """A fake sleep that records each request and can overshoot by a fixed amount."""

    def __init__(self, clock: FakeClock, overshoot_s: float = 0.0) -> None:
        self.clock, self.overshoot_s, self.taken = clock, overshoot_s, []  # type: ignore[var-annotated]

    def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)
        self.clock.advance(seconds + self.overshoot_s)


def _loop(dev: FakeDevice, wait: Hybrid, steps: int, step_s: float, depth: int = 1) -> None:
    thr = dev.throttle(depth, wait=wait)
    for _ in thr.wrap(range(steps)):
        dev.host(5e-6)
        dev.launch(step_s)


def test_resolve_wait_knows_hybrid_and_gives_each_throttle_its_own() -> None:
    a, b = resolve_wait("hybrid"), resolve_wait("hybrid")
    assert isinstance(a, Hybrid) and a is not b
    assert a.honours_timeout and not a.blocking_events
    assert {type(resolve_wait(n)) for n in ("spin", "poll")} == {Spin, Poll}
    with pytest.raises(ValueError, match="'hybrid'"):
        resolve_wait("nap")


def test_learns_the_wait_then_sleeps_once_and_spins_a_little() -> None:
    dev = FakeDevice()
    naps = Naps(dev.clock, overshoot_s=80e-6)
    wait = Hybrid(clock=dev._spinning_clock, sleep=naps)
    _loop(dev, wait, 40, 10e-3)
    predicted = wait.predict()
    assert predicted == pytest.approx(10e-3 - 5e-6, abs=20e-6)
    assert wait.overshoot_s == pytest.approx(80e-6, abs=2e-6)  # measured, not assumed
    naps.taken.clear()
    queries = dev.queries
    _loop(dev, wait, 10, 10e-3)
    assert len(naps.taken) <= 2 * 10 + 1  # per wait: a long sleep, then a short one up to the wake
    assert sorted(naps.taken)[9] <= predicted / 8 + 1e-9  # the short ones: at most an eighth of the wait
    per_wait = (dev.queries - queries) / 10
    margin = wait.overshoot_s + wait.slack_s + wait.jitter * predicted
    assert per_wait < 2 * margin / 1e-6 + 10  # spins only through the margin (1 us per fake query)


def test_the_throughput_matches_spin_on_the_fake_device() -> None:
    spin_dev, hybrid_dev = FakeDevice(), FakeDevice()
    _loop(hybrid_dev, hybrid_dev.wait("hybrid"), 50, 1e-3)  # type: ignore[arg-type]
    thr = spin_dev.throttle(1, wait="spin")
    for _ in thr.wrap(range(50)):
        spin_dev.host(5e-6)
        spin_dev.launch(1e-3)
    assert hybrid_dev.clock() <= spin_dev.clock() * 1.03


def test_an_overslept_history_converges_down_onto_the_true_wait() -> None:
    dev = FakeDevice()
    wait = Hybrid(clock=dev._spinning_clock, sleep=Naps(dev.clock, overshoot_s=80e-6))
    for _ in range(16):
        wait._waits.append(3e-3)  # as if every earlier wait had overslept a 1 ms step badly
    _loop(dev, wait, 60, 1e-3)
    assert wait.predict() == pytest.approx(1e-3, abs=30e-6)


class AtTime:
    """An event that completes at a fixed time on a fake clock."""

    def __init__(self, clock: FakeClock, at: float) -> None:
        self.clock, self.at = clock, at

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.clock() >= self.at

    def synchronize(self) -> None:
        raise AssertionError("hybrid never calls synchronize()")


def test_an_event_that_completes_during_the_last_nap_leaves_a_tight_lower_bound() -> None:
    clock = FakeClock()
    late = Naps(clock)
    wait = Hybrid(clock=clock, sleep=late)
    for _ in range(16):
        wait._waits.append(10e-3)
    wait._overshoots.extend([80e-6] * 8)
    late.overshoot_s = 0.0
    event = AtTime(clock, 9.9e-3)  # due just before the wake, which the short last nap oversleeps
    original = late.__call__

    def oversleep_short_naps(seconds: float) -> None:
        late.overshoot_s = 600e-6 if seconds < 2e-3 else 0.0
        original(seconds)

    wait._sleep = oversleep_short_naps
    assert wait(event, None) is True
    recorded = wait._waits[-1]
    assert 8e-3 < recorded <= 9.9e-3  # the start of the last nap: a lower bound close to the truth, not 0
    assert len(late.taken) == 2


def test_sporadic_oversleeping_does_not_collapse_the_prediction() -> None:
    dev = FakeDevice()
    count = [0]

    def sleep(seconds: float) -> None:  # every fifth sleep returns 600 us late (a VM's idle CPU), others 80 us
        count[0] += 1
        dev.clock.advance(seconds + (600e-6 if count[0] % 5 == 0 else 80e-6))

    wait = Hybrid(clock=dev._spinning_clock, sleep=sleep)
    predictions = []
    real = wait.predict

    def predict() -> float | None:
        predictions.append(real())
        return predictions[-1]

    wait.predict = predict  # type: ignore[method-assign]
    _loop(dev, wait, 80, 10e-3)
    learned = [p for p in predictions if p is not None]
    assert len(learned) > 70 and min(learned) > 8e-3  # never back to polling from scratch


def test_without_a_prediction_it_spins_briefly_then_sleeps_in_growing_slices() -> None:
    clock = FakeClock()
    naps = Naps(clock)
    wait = Hybrid(clock=clock, sleep=naps, spin_s=0.0, max_sleep_s=0.01)
    assert wait.predict() is None
    assert wait(NeverEvent(), 0.5) is False
    assert clock() == pytest.approx(0.5)
    assert naps.taken == sorted(naps.taken[:-1]) + naps.taken[-1:]  # growing (the last is cut by the deadline)
    assert max(naps.taken) <= 0.01  # Ctrl-C latency bounded by max_sleep_s


def test_timeout_is_honoured_while_sleeping_towards_a_prediction() -> None:
    clock = FakeClock()
    wait = Hybrid(clock=clock, sleep=clock.sleep, spin_s=0.0)
    for _ in range(3):
        wait._waits.append(1.0)
    assert wait(NeverEvent(), 0.2) is False
    assert clock() == pytest.approx(0.2)
    assert len(wait._waits) == 3  # a timed-out wait teaches nothing


def test_sleep_slices_never_exceed_max_sleep_s() -> None:
    clock = FakeClock()
    naps = Naps(clock)
    wait = Hybrid(clock=clock, sleep=naps, max_sleep_s=0.05)
    for _ in range(3):
        wait._waits.append(2.0)
    assert wait(NeverEvent(), 1.0) is False
    assert max(naps.taken) <= 0.05


def test_throttle_timeout_with_hybrid_raises() -> None:
    from asyncthrottle import ThrottleTimeout

    dev = FakeDevice()
    thr = dev.throttle(1, wait="hybrid", timeout=0.01)
    with pytest.raises(ThrottleTimeout):
        for _ in thr.wrap(range(3)):
            dev.launch(1.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"history": 0}, "history must be an int >= 1"),
        ({"min_samples": 20}, "min_samples must be in \\[1, history\\], got 20 with history=16"),
        ({"quantile": 1.5}, "quantile must be in \\[0, 1\\], got 1.5"),
        ({"max_sleep_s": 0.5}, "max_sleep_s must be in \\(0, 0.1\\]"),
        ({"fraction": 0.0}, "fraction must be > 0"),
        ({"jitter": -1.0}, "must be >= 0"),
    ],
)
def test_bad_options_name_the_value(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Hybrid(**options)  # type: ignore[arg-type]
