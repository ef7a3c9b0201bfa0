"""``run`` on a real GPU (skipped without CUDA; ``benchmarks/gpu.sh`` runs them): a compiled model
keeps its graphs, a script that hides the GPUs at its top sees none, the runner's own work
makes no sync, and a read every step is named, counted and timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _runs import pair, python, read_report

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.timeout(600)]


def _both(script: str, tmp_path: Path, *args: str) -> tuple[Any, Any, dict[str, Any]]:
    """The script under python and under run at once: (python's, run's, run's report)."""
    report = tmp_path / "report.json"
    plain, done = pair((script, str(tmp_path / "plain.json"), *args),
                       ("-m", "asyncthrottle", "run", "--json", str(report), script,
                        str(tmp_path / "run.json"), *args))
    assert plain.returncode == 0, plain.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
    return plain, done, read_report(report)


def test_on_cuda_a_compiled_model_gets_the_same_graphs_and_no_warning(tmp_path: Path) -> None:
    plain, done, report = _both("compiled.py", tmp_path, "cuda")
    assert done.stdout == plain.stdout and done.stdout.startswith(b"graphs 2 breaks 0")
    # nothing on stderr before the report that python did not print
    assert done.stderr.decode().split("asyncthrottle run:")[0] == plain.stderr.decode()
    assert report["steps"] == 4
    kept = json.loads((tmp_path / "run.json").read_text())
    assert report["losses"] == pytest.approx(kept, rel=1e-5)


def test_a_script_that_hides_the_gpus_at_its_top_sees_none_under_run() -> None:
    plain = python("cuda_visible_devices.py")
    done = python("-m", "asyncthrottle", "run", "cuda_visible_devices.py")
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert plain.stdout == done.stdout == b"cuda False 0\n"
    assert "asyncthrottle run: cuda_visible_devices.py: 3 steps" in done.stderr.decode()


def test_on_cuda_the_runner_adds_no_sync_and_delivers_every_loss(tmp_path: Path) -> None:
    """No read in the loop: the runner's losses are deferred copies, so the audit finds nothing in
    steps (CUDA's own sync detection included) and every step's loss arrives."""
    _, _, report = _both("cuda_reads.py", tmp_path, "none")
    assert report["steps"] == 30
    assert [row for row in report["syncs"] if row["in_step"]] == [], report["syncs"]
    kept = json.loads((tmp_path / "run.json").read_text())
    assert report["losses"] == pytest.approx(kept, rel=1e-5)
    assert report["stats"]["device_ms_mean"] is not None, report["stats"]


def test_on_cuda_a_read_every_step_is_named_counted_and_timed(tmp_path: Path) -> None:
    plain, done, report = _both("cuda_reads.py", tmp_path, "item")
    assert done.stdout == plain.stdout
    (row,) = [row for row in report["syncs"] if row["in_step"]]
    assert row["site"] == "cuda_reads.py:26" and row["call"] == "Tensor.item", row
    assert row["per_step"] == 1.0 and row["blocked_s"] is not None and row["blocked_s"] > 0, row
    assert report["suggestions"][0].startswith("cuda_reads.py:26 calls loss.item() every step")
