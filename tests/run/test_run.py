"""The project's own example, unchanged, under ``python -m asyncthrottle run``: the loss the report
holds is the one the script logs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from _runs import ROOT, under_run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_mnist_example_s_logged_loss_is_the_report_s(tmp_path: Path) -> None:
    args = ["--data", "synthetic", "--device", "cpu", "--no-progress", "--batch-size", "32",
            "--max-steps", "20", "--epochs", "1", "--seed", "1"]
    done, report = under_run(str(ROOT / "examples" / "mnist.py"), tmp_path, *args)
    assert done.returncode == 0, done.stderr.decode()
    logged = re.search(r"train loss ([\d.]+) -> ([\d.]+) \(mean ([\d.]+)\)", done.stdout.decode())
    assert logged is not None
    losses = report["losses"]
    assert report["steps"] == len(losses) == 20 and None not in losses
    first, last, mean = (float(v) for v in logged.groups())
    assert (round(losses[0], 3), round(losses[-1], 3)) == (first, last)
    assert round(sum(losses) / len(losses), 3) == mean
    # the evaluation's batches are no steps, and the script's own summary is on its stdout
    assert "asyncthrottle: 20 steps" in done.stdout.decode()
