"""The fake device's wait strategies: they run on its clock alone."""

from __future__ import annotations

import os

import pytest

from asyncthrottle.testing import FakeDevice


@pytest.mark.parametrize("kind", ["hybrid", "spin-block"])
def test_a_spin_on_the_fake_clock_hands_no_core_to_other_processes(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its spin ends by its clock reads: an os.sched_yield() a read would give the core away, a
    scheduler slice each on a busy machine (a test of a few fake milliseconds ran past pytest's
    120 s beside two busy loops)."""
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    dev = FakeDevice()
    thr = dev.throttle(1, wait=kind)
    for _ in thr.wrap(range(8)):
        dev.launch(0.005)
    assert thr.stats.waits >= 7  # (it spun: every hand-out waited on the step before)
    assert yields == []


def test_a_strategy_asked_to_yield_still_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    dev = FakeDevice()
    thr = dev.throttle(1, wait=dev.wait("hybrid", yield_gil=True))
    for _ in thr.wrap(range(8)):
        dev.launch(0.005)
    assert yields
