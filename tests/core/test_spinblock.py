"""spin-block and wait="auto": spin while the loop's waits are short, else sleep in the runtime's
wait; "auto" picks it where the device is the host's own cores."""

from __future__ import annotations

import inspect
import re

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.core.waits import Hybrid, Poll, Spin, SpinBlock, auto_wait
from asyncthrottle.testing import FakeDevice


def _strategy(thr: at.Throttle) -> object:
    wait = inside(thr).core.wait_strategy
    # the stall report wraps a strategy that checks deadlines
    return getattr(wait, "wait", wait)


def _loop(dev: FakeDevice, thr: at.Throttle, steps: int, step_s: float) -> None:
    for _ in thr.wrap(range(steps)):
        dev.launch(step_s)


def test_long_waits_sleep_in_the_runtime_after_a_learning_spin() -> None:
    dev = FakeDevice()
    wait = dev.wait("spin-block", spin_s=1e-4)
    thr = dev.throttle(1, wait=wait, sample_every=None)
    _loop(dev, thr, 3, 0.010)
    # no prediction yet: each of the first waits (two hand-outs, the drain) spins for spin_s, then
    # synchronizes
    assert dev.syncs == thr.stats.waits == 3 and thr.stats.completed == 3
    spun = dev.queries
    assert spun > 3 * 50  # spin_s of spinning each (a fake microsecond a clock read)
    _loop(dev, thr, 20, 0.010)
    # predicted 10 ms >> spin_s: straight to synchronize(), after the core's own query and a few
    # more (the dry-device check at the record, the retirement)
    assert dev.syncs == thr.stats.waits == 23
    assert dev.queries - spun <= 4 * 20
    assert wait.predict() == pytest.approx(0.010, rel=0.01)


def test_short_waits_are_spun_and_never_synchronize() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait=dev.wait("spin-block", spin_s=1e-3), sample_every=None)
    _loop(dev, thr, 50, 20e-6)  # 20 us steps: each wait is spun out within spin_s
    assert dev.syncs == 0 and thr.stats.completed == 50 and thr.stats.waits >= 40


def test_a_short_wait_longer_than_its_spin_falls_back_to_synchronize() -> None:
    dev = FakeDevice()
    wait = dev.wait("spin-block", spin_s=1e-4)
    thr = dev.throttle(1, wait=wait, sample_every=None)
    _loop(dev, thr, 10, 20e-6)  # short waits: learnt as short
    assert dev.syncs == 0
    _loop(dev, thr, 2, 0.050)  # then long steps: the spin gives up after spin_s
    assert dev.syncs == 2 and thr.stats.completed == 12  # the hand-out's wait and the drain's


def test_the_depth_rule_holds_under_spin_block() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin-block", sample_every=None)
    ends: list[float] = []
    for _ in thr.wrap(range(30)):
        ends.append(dev.launch(0.003))
        # at the hand-out of step n every step <= n - 2 has completed
        step = len(ends) - 1
        if step >= 2:
            assert dev.clock() >= ends[step - 2]
    assert thr.stats.max_in_flight <= 2


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="spin_s must be >= 0"):
        SpinBlock(spin_s=-1)
    with pytest.raises(ValueError, match="min_samples"):
        SpinBlock(history=2, min_samples=3)
    with pytest.raises(ValueError, match="quantile"):
        SpinBlock(quantile=2)


_BAD_WAIT_OPTIONS = [
    ("spin_s", "1ms", TypeError),  # Python's own error named no option
    ("spin_s", float("nan"), ValueError),  # a NaN deadline compares False: spun however long
    ("spin_s", True, TypeError),
    ("max_sleep_s", float("nan"), ValueError),
    ("fraction", "0.02", TypeError),
    ("history", 2.5, TypeError),
    ("quantile", float("nan"), ValueError),
    ("yield_gil", "no", TypeError),  # truthy: taken as True without a word
    ("clock", None, TypeError),
    ("sleep", 0.001, TypeError),
]


@pytest.mark.parametrize(
    ("strategy", "option", "value", "error"),
    [(strategy, *bad) for strategy in (Hybrid, Poll, SpinBlock, Spin) for bad in _BAD_WAIT_OPTIONS
     if bad[0] in inspect.signature(strategy).parameters],
)
def test_every_wait_option_names_itself_the_value_and_a_fix(
    strategy: type, option: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=f"^{option} must be .*got {re.escape(repr(value))}.*; "):
        strategy(**{option: value})


def test_spin_block_refuses_a_timeout_and_auto_takes_one() -> None:
    dev = FakeDevice()
    with pytest.raises(ValueError, match=r"timeout=1.0 cannot interrupt wait='spin-block'; use "
                                         r"wait='auto', 'hybrid', 'poll' or 'spin'"):
        at.Throttle(2, events=dev.event, wait="spin-block", timeout=1.0)
    thr = at.Throttle(2, events=dev.event, timeout=1.0)
    assert isinstance(_strategy(thr), Hybrid)


def test_auto_picks_by_where_the_device_computes() -> None:
    assert isinstance(auto_wait(computes_on_host=True, timeout=None), SpinBlock)
    # a timeout must be honoured: a sleep in the runtime cannot be cut short
    assert isinstance(auto_wait(computes_on_host=True, timeout=5.0), Hybrid)
    assert isinstance(auto_wait(computes_on_host=False, timeout=None), Hybrid)
    # a custom events= backend (an accelerator's, a fake's): hybrid
    assert isinstance(_strategy(at.Throttle(2, events=FakeDevice().event)), Hybrid)


def test_auto_on_jax_cpu_is_spin_block_and_delivers_every_value() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    thr = at.Throttle(2, device="jax")
    assert jax.devices()[0].platform == "cpu"
    assert isinstance(_strategy(thr), SpinBlock)
    assert not isinstance(_strategy(at.Throttle(2, device="jax", timeout=30.0)), SpinBlock)

    @jax.jit
    def step(x: object, w: object) -> object:
        # device work to wait for (w @ w), then a value that names the step
        return x + 1.0 + 0.0 * jnp.sum(w @ w)  # type: ignore[operator]

    x, w = jnp.zeros(()), jnp.ones((256, 256))
    seen: list[tuple[int, float]] = []
    thr.on_complete(lambda s, values: seen.append((s, float(values["loss"]))))
    for _ in thr.wrap(range(25)):
        x = step(x, w)
        thr.defer(x, name="loss")
    assert seen == [(s, s + 1.0) for s in range(25)] and thr.stats.completed == 25


def test_the_spin_or_block_choice_is_the_predictions_without_a_sort() -> None:
    import random

    now = [0.0]

    class Step:
        """Completes at a fake time; each query is a fake microsecond, synchronize() sleeps to it."""

        def __init__(self, seconds: float) -> None:
            self.done_at, self.syncs = now[0] + seconds, 0

        def query(self) -> bool:
            now[0] += 1e-6
            return now[0] >= self.done_at

        def synchronize(self) -> None:
            self.syncs += 1
            now[0] = max(now[0], self.done_at)

    wait = SpinBlock(spin_s=1e-4, history=8, quantile=0.25, min_samples=3, yield_gil=False,
                     clock=lambda: now[0])
    draw = random.Random(7)
    for _ in range(400):
        # runs of short and of long waits, so that the window's quantile crosses spin_s both ways
        seconds = draw.choice((20e-6, 40e-6, 5e-3)) if draw.random() < 0.6 else 2e-3
        predicted = wait.predict()
        spins = predicted is None or predicted < wait.spin_s
        step = Step(seconds)
        assert wait(step, None)
        # a spin sees a short step finish; a long one (or no spin) ends in synchronize()
        assert step.syncs == (0 if spins and seconds < wait.spin_s else 1)
