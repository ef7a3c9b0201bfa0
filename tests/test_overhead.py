"""The core benchmark's structure (its figures belong in BENCHMARKS.md, not in assertions)."""

from __future__ import annotations

import math

from asyncthrottle.bench import overhead


def test_overhead_reports_every_configuration() -> None:
    result = overhead.measure_overhead(steps=2000, repeats=1)
    assert set(result) == {
        "steps", "bare_us", "null_us", "noop_events_us", "timed_events_us", "timed_events_no_sampling_us",
    }
    assert all(math.isfinite(value) for value in result.values())


def test_wait_strategies_are_measured_on_the_simulated_device() -> None:
    rows = overhead.measure_waits(steps=5, device_s=1e-4, launch_s=0.0, repeats=1)
    waits = ("spin", "block", "poll", "hybrid")
    assert [(r["depth"], r["wait"]) for r in rows] == [(d, w) for d in (1, 2) for w in waits]
    assert all(r["max_in_flight"] <= r["depth"] and r["steps_per_s"] > 0 for r in rows)
