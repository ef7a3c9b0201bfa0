"""benchmarks/gpu.sh: skips cleanly without CUDA; its report runner and MNIST section work (no GPU needed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import forked
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_exits_0_with_a_clear_message(tmp_path: Path) -> None:
    gpu = _gpu()
    if gpu.cuda_available():
        pytest.skip("a CUDA GPU is present")
    report = tmp_path / "r.md"
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), str(report)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA GPU here" in proc.stdout and not report.exists()


def test_the_report_is_rewritten_after_each_step_and_survives_a_failing_one(tmp_path: Path) -> None:
    gpu = _gpu()
    report = tmp_path / "r.md"
    seen: list[str] = []

    def first(budget_s: float) -> str:
        seen.append(report.read_text() if report.exists() else "")
        return "one\n"

    def broken(budget_s: float) -> str:
        raise RuntimeError("no device")

    def last(budget_s: float) -> str:
        seen.append(report.read_text())
        return "three\n"

    gpu.run(report, [gpu.Step("A", 5, first), gpu.Step("B", 5, broken), gpu.Step("C", 5, last)], total_s=60)
    text = report.read_text()
    assert seen[0] == "" and "## A\n\none" in seen[1]
    assert "## B\n\nFailed: RuntimeError: no device" in text and "## C\n\nthree" in text


def test_steps_beyond_the_budget_are_reported_as_skipped(tmp_path: Path) -> None:
    gpu = _gpu()
    report = tmp_path / "r.md"
    gpu.run(report, [gpu.Step("A", 5, lambda budget_s: "ran\n")], total_s=5)
    assert "Skipped: the run's time budget" in report.read_text()


def test_command_sections_show_the_command_status_and_output() -> None:
    gpu = _gpu()
    body = gpu.command_section([sys.executable, "-c", "print('hello')"])(30)
    assert "exit 0" in body and "hello" in body and "-c" in body


def test_the_sections_fit_in_9_minutes_and_each_run_gets_what_it_needs() -> None:
    gpu = _gpu()
    # one run and a partial rerun in 15 minutes of GPU time, the machine's start included; one
    # command may run 10 minutes
    assert sum(step.budget_s for step in gpu.STEPS) <= gpu.TOTAL_S <= 540
    budgets = {step.title: step.budget_s for step in gpu.STEPS}
    frameworks = next(b for t, b in budgets.items() if t.startswith("Lightning and transformers"))
    assert frameworks / len(gpu.FRAMEWORK_RUNS) >= 15  # a run took 10-15 s with imports; they got ~9 s
    wide = next(b for t, b in budgets.items() if "--width 32" in t)
    assert wide / len(gpu.WIDE_RUNS) >= 15
    waits = next(s for s in gpu.STEPS if "bench --waits" in s.title)
    body = waits.run.__closure__  # the command carries its own cap, below the section's budget
    argv = next(c.cell_contents for c in body if isinstance(c.cell_contents, list))
    assert float(argv[argv.index("--max-s") + 1]) < waits.budget_s


def test_the_wide_setting_runs_side_by_side_by_depth() -> None:
    gpu = _gpu()
    assert [label for label, _ in gpu.WIDE_RUNS] == ["none", "1", "2", "auto", "2 + .item() every step"]
    assert all("--width" in flags and "--batch-size" in flags for _, flags in gpu.WIDE_RUNS)


@pytest.mark.slow
@pytest.mark.timeout(600)  # two child processes that import torch: minutes on a loaded machine
def test_the_mnist_section_runs_the_example_and_shows_memory_and_the_verdict_per_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _gpu()
    shell = gpu.shell

    def forks(argv: list[str], timeout_s: float) -> tuple[int, str]:
        # each run a fork of the suite's server that has imported torch (shell() itself starts
        # a fresh interpreter: tested above), from the source tree as shell() runs it
        if argv[0] != gpu.PYTHON:
            return shell(argv, timeout_s)
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        done = forked.run(argv[1:], cwd=ROOT, env=env, timeout=timeout_s, text=True)
        return done.returncode, done.stdout + done.stderr

    monkeypatch.setattr(gpu, "shell", forks)
    tiny = ("--device", "cpu", "--width", "2", "--batch-size", "8")
    body = gpu.mnist(540, runs=[("none", ("--depth", "none", *tiny)),
                                ("2 + .item()", ("--depth", "2", "--item-every-step", *tiny))], max_steps=3)
    assert "| none |" in body and "| 2 + .item() |" in body and "failed" not in body, body
    assert "peak device MiB" in body and "verdict" in body
    assert body.count("| n/a | n/a |") == 2  # no CUDA here: no memory figures, said as n/a
