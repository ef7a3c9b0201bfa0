"""The core benchmark's structure (its figures belong in BENCHMARKS.md, not in assertions)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from asyncthrottle.bench import overhead


def test_overhead_reports_every_configuration_as_a_median_with_its_range(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = overhead.Throttle

    def throttle(depth: int, **options: Any) -> Any:
        made.append(options)
        return real(depth, **options)

    monkeypatch.setattr(overhead, "Throttle", throttle)
    result = overhead.measure_overhead(steps=2000, runs=3, best_of=1, telemetry={"trace": 0})
    throttled = ("null", "noop_events", "timed_events", "timed_events_no_sampling")
    cases = (*throttled, "reference", "generator")  # the 15-line and 10-line loops beside them, same rounds
    fields = {f"{case}{suffix}" for case in cases for suffix in ("_us", "_range_us")}
    ratios = {f"{case}{suffix}" for case in (*throttled, "reference") for suffix in ("_x", "_range_x")}
    assert set(result) == {"steps", "runs", "best_of", "bare_us"} | fields | ratios
    for case in cases:
        low, high = result[f"{case}_range_us"]
        assert math.isfinite(result[f"{case}_us"]) and low <= result[f"{case}_us"] <= high
    for case in (*throttled, "reference"):  # each round's overhead over the generator's in that round
        low, high = result[f"{case}_range_x"]
        assert low <= result[f"{case}_x"] <= high
    assert len(made) == 3 * len(throttled) and all(options["trace"] == 0 for options in made)  # every round, every case
    assert sum(options.get("sample_every", 8) is None for options in made) == 3


def test_wait_strategies_are_measured_on_the_simulated_device() -> None:
    rows = overhead.measure_waits(steps=5, device_s=1e-4, launch_s=0.0, repeats=1)
    waits = ("spin", "block", "poll", "hybrid")
    assert [(r["depth"], r["wait"]) for r in rows] == [(d, w) for d in (1, 2) for w in waits]
    assert all(r["max_in_flight"] <= r["depth"] and r["steps_per_s"] > 0 for r in rows)


@pytest.mark.parametrize("wait", ["hybrid", "poll"])
def test_a_real_sigint_ends_a_wait_on_a_hung_step(wait: str) -> None:
    assert overhead.measure_interrupt(wait, delay_s=0.02) < 5.0  # it arrives (the latency is a benchmark figure)


def test_the_throttle_is_measured_beside_the_reference_loop_on_one_backend(capsys: pytest.CaptureFixture[str]) -> None:
    result = overhead.measure_beside({"events": overhead._TimedNoopEvent}, overhead._NoopEvent, steps=500, runs=2,
                                     best_of=1)
    cases = ["throttle_none"] + [f"{kind}_{d}{tail}" for d in (1, 2)
                                 for kind, tail in (("throttle", ""), ("throttle", "_no_sampling"), ("reference", ""))]
    assert all(math.isfinite(result[f"{case}_us"]) for case in cases) and result["depths"] == (1, 2)
    overhead._print_beside("here", {"backend": "no-op events", **result})
    out = capsys.readouterr().out
    assert "depth 1" in out and "depth 2" in out and "the reference's speed" in out and "depth None" in out

