"""``run`` runs a script as python would: argv, ``__main__``, its folder on ``sys.path``, its exit code,
its traceback without the runner's frames, Ctrl-C; and bad input gets a clear error."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from _runs import SCRIPTS, python

from asyncthrottle.run import main


def test_a_missing_script_is_python_s_error_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no_such_script.py"]) == 2
    assert "can't open file" in capsys.readouterr().err


def test_a_missing_module_is_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-m", "no_such_module_here"]) == 1
    assert "No module named 'no_such_module_here'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--bogus", "train.py"], "unrecognized arguments: --bogus"),
    (["--depth", "0", "train.py"], "--depth must be an int >= 1, got '0'"),
    ([], "name the script to run"),
])
def test_bad_options_are_usage_errors(argv: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_script_s_own_options_are_its_own(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(SCRIPTS)
    # --depth after SCRIPT is the script's; its sys.exit(3) is run's status
    assert main(["never_trains.py", "3", "--depth", "x"]) == 3
    out, err = capsys.readouterr()
    assert out.splitlines() == ["['3', '--depth', 'x'] __main__ scripts", "torch.Size([1, 1])"]
    assert "0 steps" in err and "no training step found" in err


def test_a_script_that_raises_at_import_shows_its_traceback_and_status_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(SCRIPTS)
    # the runner shows the error through sys.excepthook, as python does; an earlier test's
    # init_process_group (in this process) set torch's, which prefixes each line with "[rank0]:"
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    assert main(["--json", str(tmp_path / "r.json"), "raises_at_import.py"]) == 1
    out, err = capsys.readouterr()
    assert out == "starting\n"
    trace, report = err.split("asyncthrottle run:")
    # the traceback starts at the script: none of the runner's frames
    assert trace.splitlines()[1].startswith('  File "raises_at_import.py", line 4, in <module>')
    assert "asyncthrottle" not in trace and trace.endswith("RuntimeError: no data here\n")
    assert " 0 steps" in report and json.loads((tmp_path / "r.json").read_text())["steps"] == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_prints_the_report_and_exits_as_python_does() -> None:
    plain = python("interrupted.py")
    done = python("-m", "asyncthrottle", "run", "interrupted.py")
    assert plain.returncode == done.returncode == -signal.SIGINT
    err = done.stderr.decode()
    assert "KeyboardInterrupt" in err and "asyncthrottle run: interrupted.py: 2 steps" in err


_MODULE = '''import sys

import torch

from . import helper

print(sys.argv, __name__, __package__, __spec__.name, sys.path[0], helper.NAME)
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.ones(4, 2)).sum().backward()
    opt.step()
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_module_runs_as_python_m_runs_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("NAME = 'helper'\n")
    (package / "train.py").write_text(_MODULE)
    plain = python("-m", "pkg.train", "a", "-m", cwd=tmp_path)
    done = python("-m", "asyncthrottle", "run", "--json", "r.json", "-m", "pkg.train", "a", "-m",
                  cwd=tmp_path)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    # argv[0] the module's file, __main__ in its package (a relative import), the cwd first
    assert done.stdout == plain.stdout
    assert done.stdout.decode().split() == [
        f"[{str(package / 'train.py')!r},", "'a',", "'-m']", "__main__", "pkg", "pkg.train",
        str(tmp_path), "helper"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["steps"], report["argv"]) == (3, ["-m", "pkg.train", "a", "-m"])
    assert "asyncthrottle run: " in done.stderr.decode() and ": 3 steps in" in done.stderr.decode()
