"""Scripts of each style run unchanged under ``python -m asyncthrottle run``: the same stdout and exit
code as under plain python, the right steps, every loss, and the sync lines they contain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from _runs import found_syncs, said_syncs, start, under_run

# script, its steps, the steps whose loss is NaN/Inf, and the DataLoader that feeds its loop
STYLES = [
    ("loader_loop.py", 8, [], {"num_workers": 0, "pin_memory": False, "batch_size": 6}),
    ("accumulation.py", 4, [], {"num_workers": 0, "pin_memory": False, "batch_size": 4}),
    ("get_batch.py", 6, [], None),
    ("manual_sgd.py", 5, [], None),
    ("lbfgs.py", 3, [], None),
    ("grad_scaler.py", 5, [2], None),
    # the producer thread's next() is not the loop's wait, and its loader is not the loop's
    ("thread_loader.py", 4, [], None),
]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("script", "steps", "nonfinite", "loader"), STYLES)
def test_a_script_runs_as_under_python_and_its_steps_losses_and_syncs_are_found(
        script: str, steps: int, nonfinite: list[int], loader: dict[str, Any] | None,
        tmp_path: Path) -> None:
    # both at once: each is a few seconds of importing torch
    started = start(script, str(tmp_path / "plain.txt"))
    done, report = under_run(script, tmp_path, str(tmp_path / "run.txt"))
    plain = started.wait()
    assert plain.returncode == 0, plain.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
    # the script's own output, byte for byte, and its own losses (same seed)
    assert done.stdout == plain.stdout
    kept = json.loads((tmp_path / "run.txt").read_text())
    assert kept == json.loads((tmp_path / "plain.txt").read_text())
    assert report["schema"] == 1 and report["steps"] == steps == len(kept)
    assert report["nonfinite"] == nonfinite
    # the JSON's null where the loss is NaN/Inf
    assert [step for step, v in enumerate(report["losses"]) if v is None] == nonfinite
    finite = [value for step, value in enumerate(kept) if step not in nonfinite]
    assert [v for v in report["losses"] if v is not None] == pytest.approx(finite, rel=1e-6)
    assert found_syncs(report) == said_syncs(script)
    assert f"asyncthrottle run: {script}: {steps} steps" in done.stderr.decode()
    assert report["loader"] == loader
    assert (report["input_wait_s"] > 0) == (loader is not None)

