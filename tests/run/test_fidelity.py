"""What the runner must not change: the environment the script sets at its top, a compiled
model's graphs, and the script's own warnings; and what it hears inside a framework's loop."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from _runs import SCRIPTS, env, pair, python, under_run

# The first two tests are about the order of imports in a fresh interpreter (subprocess.run, not
# a fork of the suite's server that has imported torch); the others compare a script's own
# output, graphs, warnings and memory under python and under run: both forks (tests/forked.py).


def test_an_environment_the_script_sets_at_its_top_is_the_one_torch_reads() -> None:
    """torch is imported by the script, not before it: its OMP_NUM_THREADS holds."""
    unset = {k: v for k, v in env().items() if k != "OMP_NUM_THREADS"}
    runs = [subprocess.run([sys.executable, *args, "omp_at_top.py"], cwd=SCRIPTS, env=unset,
                           capture_output=True, timeout=300, check=False)
            for args in ([], ["-m", "asyncthrottle", "run"])]
    assert [done.stdout for done in runs] == [b"threads 1\n"] * 2, runs[1].stderr.decode()


def test_the_runner_imports_nothing_of_torch_before_the_script() -> None:
    code = ("import sys; from asyncthrottle.run import session, script; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))")
    done = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True,
                          timeout=120, check=True)
    assert done.stdout == b"[]\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_model_gets_the_same_graphs_and_no_warning(tmp_path: Path) -> None:
    plain = python("compiled.py", str(tmp_path / "plain.json"))
    done, report = under_run("compiled.py", tmp_path, str(tmp_path / "run.json"))
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout and done.stdout.startswith(b"graphs 2 breaks 0")
    # nothing on stderr before the report that python did not print
    assert done.stderr.decode().split("asyncthrottle run:")[0] == plain.stderr.decode()
    assert report["steps"] == 4
    kept = json.loads((tmp_path / "plain.json").read_text())
    assert report["losses"] == pytest.approx(kept, rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_step_that_calls_backward_keeps_python_s_graphs_and_breaks(
        tmp_path: Path) -> None:
    """The backward inside the compiled function runs eagerly (a graph break under python too)
    and calls the runner's wrapper: Dynamo compiles none of the runner's code."""
    plain = python("compiled_step.py", str(tmp_path / "plain.json"))
    done, report = under_run("compiled_step.py", tmp_path, str(tmp_path / "run.json"))
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout and done.stdout.startswith(b"graphs 2 breaks 1")
    assert done.stderr.decode().split("asyncthrottle run:")[0] == plain.stderr.decode()
    kept = json.loads((tmp_path / "plain.json").read_text())
    assert report["steps"] == 3 and report["losses"] == pytest.approx(kept, rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_module_and_a_compiled_optimizer_step_as_under_python(tmp_path: Path) -> None:
    """``torch.compile(model)`` warns of global module hooks on each call where it sees one (it
    must not see the runner's), and a compiled ``opt.step()`` calls no optimizer hook (its steps
    are found by the parameters it moves): gradient accumulation, two batches a step."""
    plain = python("compiled_optimizer.py", str(tmp_path / "plain.json"))
    done, report = under_run("compiled_optimizer.py", tmp_path, str(tmp_path / "run.json"))
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout == b"trained 6 steps; graphs 2 breaks 2\n"
    # nothing on stderr that python did not print (torch's log lines, less their time and pid)
    assert _logged(done.stderr.decode().split("asyncthrottle run:")[0]) == _logged(
        plain.stderr.decode())
    kept = json.loads((tmp_path / "plain.json").read_text())
    assert report["steps"] == 6 and report["losses"] == pytest.approx(kept, rel=1e-6)


def _logged(text: str) -> str:
    """stderr with the time and process id of torch's log lines left out."""
    return re.sub(r"^([IWE])\d{4} [\d:.]+ \d+ ", r"\1 ", text, flags=re.MULTILINE)


def test_torch_s_warning_in_a_hooked_call_is_printed_at_torch_s_line_as_under_python() -> None:
    """The DataLoader's pin_memory warning on a machine without an accelerator (its iterator is
    one of the runner's hooks)."""
    plain, done = pair(("pin_memory_warning.py",),
                       ("-m", "asyncthrottle", "run", "pin_memory_warning.py"))
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout == b"done\n"
    warned = done.stderr.decode().split("asyncthrottle run:")[0]
    assert warned == plain.stderr.decode() and "torch/utils/data/dataloader.py" in warned


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_runner_holds_a_few_bytes_a_step() -> None:
    """8,000 tiny steps: the process's traced memory grows by the float of each step's loss (and
    its flag), not by a tensor a step."""
    plain, done = pair(("many_steps.py", "8001"),
                       ("-m", "asyncthrottle", "run", "many_steps.py", "8001"))
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    grown = [float(process.stdout.split()[0]) for process in (plain, done)]
    assert grown[1] - grown[0] < 40, grown
    assert "many_steps.py: 8001 steps" in done.stderr.decode()
