"""The frameworks' trainers under ``python -m asyncthrottle run``: Lightning's ``Trainer.fit`` and
the HF ``Trainer.train`` get this library's callback once (torchrun's jobs: test_job_torchrun.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from _runs import SCRIPTS, found_syncs, read_report, said_syncs, start, under_run

# script, the framework it trains with, its optimizer steps
TRAINERS = [("hf_train.py", "transformers", 4), ("lightning_fit.py", "lightning", 6)]
# the modules that define each framework's trainer (what its scripts import): the servers these
# tests' processes fork from import them once (tests/forked.py), as the scripts then would
_TRAINER_MODULES = {"transformers": "transformers.trainer",
                    "lightning": "lightning.pytorch.trainer.trainer"}
# the framework's own reads, by (call, in a step, per step): the HF Trainer's NaN/Inf check of
# each micro-batch's loss (isnan, isinf: 2 micro-batches a step) and its logging's reads of the
# loss and the grad norm (logging_steps=1, after its step's callback); Lightning's check of each
# loader's length across ranks, once an epoch
OWN_READS = {"transformers": {("Tensor.__bool__", True, 4.0), ("Tensor.item", False, 1.0)},
             "lightning": {("Tensor.__bool__", False, 0.5)}}
# what each script calls the framework with
TRAINS = {"hf_train.py": "trainer.train()", "lightning_fit.py": "trainer.fit("}
# the settings the suggestions name for the framework's reads made every step, in their order
SETTINGS = {"transformers": ["logging_nan_inf_filter=False", "logging_steps=", "logging_steps="],
            "lightning": []}


def _own_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's sync rows of the script's own reads (not the framework's, via its lines)."""
    own = [row for row in report["syncs"] if row["via"] is None]
    return found_syncs({"syncs": own})


def _framework_reads(report: dict[str, Any], script: str, framework: str) -> set[Any]:
    """The framework's own reads: each at the script's line that trains, via the framework's."""
    number = next(n for n, line in enumerate((SCRIPTS / script).read_text().splitlines(), 1)
                  if TRAINS[script] in line)
    rows = [row for row in report["syncs"] if row["via"] is not None]
    assert rows and all(row["site"] == f"{script}:{number}" for row in rows), rows
    assert all(row["via"].startswith(f"{framework}/") for row in rows), rows
    return {(row["call"], row["in_step"], round(row["per_step"], 3)) for row in rows}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("script", "framework", "steps"), TRAINERS)
def test_a_trainer_runs_as_under_python_with_the_library_s_callback_once(
        script: str, framework: str, steps: int, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    # all at once, each forked from a server that has imported the framework the script imports
    # (seconds each)
    preload = ("torch", _TRAINER_MODULES[framework])
    started = start(script, str(tmp_path / "plain.json"), preload=preload)
    own_report = tmp_path / "own_report.json"
    # the script adds asyncthrottle's ThrottleCallback itself: the runner adds none
    own = start("-m", "asyncthrottle", "run", "--json", str(own_report), script,
                str(tmp_path / "own.json"), "--own", preload=preload)
    done, report = under_run(script, tmp_path, str(tmp_path / "run.json"), preload=preload)
    plain, owned = started.wait(), own.wait()
    for process in (plain, done, owned):
        assert process.returncode == 0, process.stderr.decode()
    assert done.stdout == plain.stdout == owned.stdout
    kept = json.loads((tmp_path / "plain.json").read_text())
    ran = json.loads((tmp_path / "run.json").read_text())
    assert ran["losses"] == kept["losses"] and len(kept["losses"]) == steps
    # the runner's callback, once; none where the script has its own
    assert "ThrottleCallback" not in kept["callbacks"]
    assert ran["callbacks"] == [*kept["callbacks"], "ThrottleCallback"]
    assert json.loads((tmp_path / "own.json").read_text())["callbacks"].count(
        "ThrottleCallback") == 1
    for found, process in ((report, done), (read_report(own_report), owned)):
        assert (found["steps"], found["framework"], found["error"]) == (steps, framework, None)
        # the framework's loop takes its batches from a DataLoader: the loader's wait is heard
        assert found["input_wait_s"] > 0 and found["loader"] is not None, found["loader"]
        # the losses the script recorded (the Trainer's logged loss, training_step's output)
        assert found["losses"] == pytest.approx(kept["losses"], rel=1e-6)
        # each step's host time, from the callback's hand-out to its end (no wait each)
        timed = found["per_step"]
        assert len(timed["step_s"]) == steps and all(t > 0 for t in timed["step_s"])
        assert timed["input_wait_s"] == [None] * steps
        # every read at the script's lines: its own, told in steps and outside them by the
        # callback's steps, and the framework's, at the line that trains, via the framework's
        assert all(row["site"].startswith(f"{script}:") for row in found["syncs"])
        assert _own_rows(found) == said_syncs(script)
        assert OWN_READS[framework] <= _framework_reads(found, script, framework)
        said = [said for said in found["suggestions"] if f" calls {framework}, whose " in said]
        assert len(said) == len(SETTINGS[framework]), said
        assert all(setting in line for line, setting in zip(said, SETTINGS[framework], strict=True))
        assert f"asyncthrottle run: {script}: {steps} steps" in process.stderr.decode()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_fits_are_one_run_of_all_their_steps(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    preload = ("torch", _TRAINER_MODULES["lightning"])
    started = start("two_fits.py", str(tmp_path / "plain.json"), preload=preload)
    done, report = under_run("two_fits.py", tmp_path, str(tmp_path / "run.json"), preload=preload)
    plain = started.wait()
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout
    kept = json.loads((tmp_path / "plain.json").read_text())
    assert report["steps"] == len(kept) == 8
    assert report["losses"] == pytest.approx(kept, rel=1e-6)
