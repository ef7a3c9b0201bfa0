"""Loop shapes of ordinary PyTorch (#55), each a script of our own run unchanged under ``run`` and
under python: the same output, and the steps, losses and reads the script itself counts (the
report's steps are the live steps grouped by the record's classifier: SAM's, a WGAN's and three
models' steps are the classifier's, not the live finder's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from _runs import SharedRuns, found_syncs, report_loader, said_syncs, start

# script, its steps, the DataLoader that feeds its loop (None: none)
_LOADER = report_loader(4)
SHAPES = [
    ("sam_loader.py", 16, _LOADER),
    ("sam_no_loader.py", 12, None),
    ("wgan_no_loader.py", 12, None),
    ("three_models.py", 10, _LOADER),
    ("ppo.py", 24, None),
    ("reinforce.py", 6, None),
    ("dqn_target.py", 15, None),
    ("tbptt.py", 12, _LOADER),
    ("two_views.py", 8, _LOADER),
    ("retain_graph.py", 6, None),
    ("maml.py", 5, None),
    ("accumulate_by_hand.py", 6, None),
]

# where a script writes its losses under run (its shared run's folder)
_LOSSES = "{folder}/run.txt"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("script", "steps", "loader"), SHAPES)
def test_a_loop_shape_runs_as_under_python_with_its_steps_losses_and_reads(
        script: str, steps: int, loader: dict[str, Any] | None, tmp_path: Path,
        shared_runs: SharedRuns) -> None:
    # both at once: each is a few seconds of importing torch
    started = start(script, str(tmp_path / "plain.txt"))
    done, report, folder = shared_runs.run(script, _LOSSES)
    plain = started.wait()
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout
    kept = json.loads((folder / "run.txt").read_text())
    assert kept == json.loads((tmp_path / "plain.txt").read_text())
    assert report["steps"] == steps == len(kept)
    assert report["losses"] == pytest.approx(kept, rel=1e-5, abs=1e-7)
    assert found_syncs(report) == said_syncs(script)
    assert report["loader"] == loader


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_ppo_rollout_s_time_is_no_step_s(shared_runs: SharedRuns) -> None:
    """Each update is about a millisecond; the rollout before the first of each iteration's
    (16 environment steps of 3 ms) is no step's time."""
    done, report, _ = shared_runs.run("ppo.py", _LOSSES)
    assert done.returncode == 0, done.stderr.decode()
    assert max(report["per_step"]["step_s"]) < 0.048, report["per_step"]["step_s"]
