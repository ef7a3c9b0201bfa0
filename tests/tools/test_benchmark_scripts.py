"""The benchmark scripts that are not part of ``bench`` still run (a short run of each, in its own process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_seed_host_cost_runs_every_loop_through_the_ring_and_counts_calls() -> None:
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "seed_host_cost.py"), "--rounds", "1", "--steps", "50"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr  # its own checks: every value arrived, every defer took a ring slot
    lines = [line for line in done.stdout.splitlines() if line.startswith("  ") and " py " in line]
    rows = {line.split("  ")[1].strip(): line for line in lines}
    assert set(rows) == {"reference", "defer", "defer, nonfinite=None", "defer, sample_every=None", "defer, both off"}
    assert "3.0 py   6.0 C" in rows["reference"]  # exact: TorchEvent.record and its no-op event's two
