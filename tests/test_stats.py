"""The verdict and its advice: what limits a loop, said in the terms of the loop's shape and its backend."""

from __future__ import annotations

import pytest

import asyncthrottle as at
from asyncthrottle.backends import Backend
from asyncthrottle.testing import FakeClock, FakeDevice

MS = 1e-3


def _step_loop_with_an_evaluation(dev: FakeDevice, thr: at.Throttle, *, pause: bool = False) -> None:
    """nanoGPT's shape: a ``while True`` of ``step()``s, an evaluation every 10 iterations between them."""
    for it in range(50):
        if it % 10 == 0 and it:
            if pause:
                thr.pause()  # what the advice says
            dev.host(100 * MS)  # the evaluation: host time, no batch taken
        dev.host(0.5 * MS)  # get_batch(): a few slices
        with thr.step():
            dev.host(2 * MS)
            dev.launch(1 * MS)


def test_a_step_loops_evaluation_is_not_called_fetching() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    _step_loop_with_an_evaluation(dev, thr)
    stats = thr.stats
    # before: fetch_s 0.42 s of 0.52, "input-bound -- ... look at DataLoader num_workers"
    assert stats.fetch_s == 0.0 and stats.between_s == pytest.approx(0.4 + 49 * 0.5 * MS)
    assert stats.fetch_s + stats.between_s + stats.body_s + stats.wait_s == pytest.approx(stats.wall_s)
    assert stats.verdict == "host-bound"
    assert "between steps" in stats.advice and "drain() or pause() before an evaluation" in stats.advice
    summary = thr.summary()
    assert "DataLoader" not in summary and "num_workers" not in summary and "torch.compile" not in summary
    assert "between steps 0.42" in summary, summary


def test_pause_before_the_evaluation_leaves_it_out_of_the_loop() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    _step_loop_with_an_evaluation(dev, thr, pause=True)
    stats = thr.stats
    assert stats.between_s == pytest.approx(45 * 0.5 * MS)  # the get_batch() slices only
    assert stats.wall_s == pytest.approx(50 * 2 * MS + 45 * 0.5 * MS)
    assert stats.verdict == "host-bound" and "torch.compile" in stats.advice  # now the body's advice


def test_a_wrapped_loops_slow_source_is_still_input_bound() -> None:
    dev = FakeDevice()

    def source():  # type: ignore[no-untyped-def]
        for i in range(20):
            dev.host(10 * MS)  # the loader's own time
            yield i

    thr = dev.throttle(2, sample_every=None)
    for _ in thr.wrap(source()):
        dev.host(1 * MS)
        dev.launch(1 * MS)
    stats = thr.stats
    assert stats.verdict == "input-bound" and "num_workers" in stats.advice and stats.between_s == 0.0


def test_a_host_bound_jax_loop_is_told_jax_advice() -> None:
    jnp = pytest.importorskip("jax.numpy")
    clock = FakeClock()
    thr = at.Throttle(2, device="jax", clock=clock, sample_every=None)
    x = jnp.ones(4)
    for _ in thr.wrap(range(20)):
        x = x + 1
        clock.advance(5 * MS)  # Python around a small dispatched step
    summary = thr.summary()
    assert "verdict: host-bound" in summary
    # before: "try bigger batches, torch.compile or CUDA graphs" on JAX
    assert "torch.compile" not in summary and "CUDA" not in summary, summary
    assert "jax.jit over more of the step" in summary and "lax.scan over several steps" in summary
    assert thr.stats.advice in summary and "detect_sync" not in summary  # it cannot name JAX's syncs


@pytest.mark.parametrize(("kind", "said", "unsaid"), [
    ("cuda", ["torch.compile", "CUDA graphs", "detect_sync"], ["jax"]),
    ("mps", ["torch.compile"], ["CUDA", "detect_sync", "jax"]),
    ("jax", ["jax.jit", "lax.scan"], ["torch", "CUDA"]),
])
def test_each_backend_gives_its_own_host_advice(kind: str, said: list[str], unsaid: list[str]) -> None:
    advice = Backend(kind, None, None, None, trusted=True).host_advice
    assert all(word in advice for word in said) and not any(word in advice for word in unsaid), advice


def test_the_advice_is_no_figure_for_loggers() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    for _ in thr.wrap(range(3)):
        dev.launch(1 * MS)
    flat = thr.stats.as_dict()
    assert "verdict" in flat and "advice" not in flat and flat["between_s"] == 0.0
    assert at.Stats().advice == "too few steps to tell what limits the loop (a verdict needs 2 or more)"
