"""The benchmark scripts that are not part of ``bench`` still run (a short run of each, in its own process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_add_one_host_cost_runs_every_loop_through_the_ring_and_counts_calls() -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "add_one_host_cost.py"), "--rounds", "1", "--steps", "50"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr  # its own checks: every value arrived, every defer took a ring slot
    lines = [line for line in done.stdout.splitlines() if line.startswith("  ") and " py " in line]
    rows = {line.split("  ")[1].strip(): line for line in lines}
    assert set(rows) == {"reference", "defer", "defer, nonfinite=None", "defer, sample_every=None", "defer, both off"}
    assert "3.0 py   6.0 C" in rows["reference"]  # exact: TorchEvent.record and its no-op event's two


@pytest.mark.parametrize("metrics", [False, True], ids=["the-loss", "a-dict-of-metrics"])
def test_values_host_cost_runs_and_counts_the_calls_of_each_loop(metrics: bool) -> None:
    pytest.importorskip("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "values_host_cost.py"), "--rounds", "1", "--steps", "200",
         *(["--metrics"] if metrics else [])],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr  # its own check: every number of every step arrived
    rows = {line.split("  ")[1].strip(): line.split() for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(rows) == {"maxtext", "defer", "defer, nonfinite=None", "defer, sample_every=None"}
    python = float(rows["defer"][-4])  # "... <py> py <C> C"
    # exact counts (the stand-ins call no JAX): a bound that a slower walk or watch would break
    assert python <= (48.0 if metrics else 26.0), done.stdout


def test_jax_metrics_runs_every_loop_and_every_metric_arrives() -> None:
    pytest.importorskip("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "jax_metrics.py"), "--steps", "30", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr  # its own check: 3 metrics a step arrived in every loop
    rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert rows == ["maxtext", "by-hand", "defer(dict)", "defer"]  # ("defer each" splits at its space)
