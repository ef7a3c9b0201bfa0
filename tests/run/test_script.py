"""``run`` runs a script as python would: argv, ``__main__``, its folder on ``sys.path``, its exit code,
its traceback without the runner's frames, Ctrl-C; and bad input gets a clear error."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import traceback
import zipapp
from pathlib import Path

import _runs
import pytest
from _runs import SCRIPTS, env, read_report

from asyncthrottle.run import main

# What this module tests is the runner's fidelity to python itself (``__main__``, tracebacks,
# signals, atexit, sys.path). A fork of the suite's server (tests/forked.py) runs a command as
# python does in argv, sys.path, the working folder, -m, threads, atexit and exit codes; the tests
# of what it does not give start a fresh interpreter (``fresh=True``): the globals of a script's
# and a zipapp's __main__ (the server's own __main__ shows through), a traceback's every frame
# (a KeyboardInterrupt shows the server's) and signals sent to the process.
pair = _runs.pair
python = _runs.python

_RUN = ("-m", "asyncthrottle", "run")


@pytest.fixture(autouse=True)
def _as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    # an in-process run leaves sys.argv, sys.path[0] and __main__ as the script left them, as
    # python does: give them back to pytest
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def _report_of(err: bytes) -> str:
    """The runner's report: stderr from its first line on."""
    text = err.decode()
    return text[text.index("asyncthrottle run"):]


def _before_report(err: bytes) -> str:
    text = err.decode()
    return text[:text.index("asyncthrottle run")]


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
    # the traceback starts at the script (its absolute path, as python says): no runner frame
    assert trace.splitlines()[1] == f'  File "{SCRIPTS / "raises_at_import.py"}", line 4, in <module>'
    assert "asyncthrottle" not in trace and trace.endswith("RuntimeError: no data here\n")
    assert ("  no training step found: the script raised RuntimeError at raises_at_import.py:4 "
            "before any step: no data here (0 steps)") in report.splitlines()
    assert "never called backward()" not in report
    data = read_report(tmp_path / "r.json")
    assert data["steps"] == 0 and data["raised"] == {
        "type": "RuntimeError", "message": "no data here", "site": "raises_at_import.py:4",
        "started": True}


def test_a_script_that_does_not_compile_gets_python_s_message_and_did_not_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(SCRIPTS)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    script = SCRIPTS / "syntax_error.py"
    with pytest.raises(SyntaxError) as compiling:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    assert main(["--json", str(tmp_path / "r.json"), "syntax_error.py"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # its first line, a print, never ran
    message, report = err.split("asyncthrottle run:")
    # python's own message (the file, the line, the caret), as python prints it: no traceback
    assert message == "".join(traceback.format_exception_only(compiling.value))
    assert message.startswith(f'  File "{script}", line 6\n')
    assert ("  the script did not start: SyntaxError at syntax_error.py:6: '(' was never closed "
            "(0 steps)") in report.splitlines()
    assert "never called backward()" not in report and "no training step found" not in report
    assert read_report(tmp_path / "r.json")["raised"] == {
        "type": "SyntaxError", "message": "'(' was never closed", "site": "syntax_error.py:6",
        "started": False}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_prints_the_report_and_exits_as_python_does() -> None:
    plain, done = pair(("interrupted.py",), ("-m", "asyncthrottle", "run", "interrupted.py"),
                       fresh=True)
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
    report = read_report(tmp_path / "r.json")
    assert (report["steps"], report["argv"]) == (3, ["-m", "pkg.train", "a", "-m"])
    assert "asyncthrottle run: " in done.stderr.decode() and ": 3 steps in" in done.stderr.decode()


def _both(*args: str, cwd: Path = SCRIPTS, fresh: bool = False
          ) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """``python ARGS`` and ``python -m asyncthrottle run ARGS``."""
    return pair(args, (*_RUN, *args), cwd=cwd, fresh=fresh)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_main_is_python_s_and_stays_the_script_s() -> None:
    # run from the scripts' parent folder, the script's path relative
    plain, done = _both("scripts/main_globals.py", "x", cwd=SCRIPTS.parent, fresh=True)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout
    lines = done.stdout.decode().splitlines()
    # the globals python makes; __file__ absolute; builtins a module; no __future__ of ours
    assert lines[0] == str({"__annotations__": "dict", "__builtins__": "module",
                            "__cached__": "NoneType", "__doc__": "str", "__file__": "str",
                            "__loader__": "SourceFileLoader", "__name__": "str",
                            "__package__": "NoneType", "__spec__": "NoneType"})
    assert lines[1] == (f"__main__ {SCRIPTS / 'main_globals.py'} True SourceFileLoader None "
                        "None None True")
    assert lines[2] == ("{'x': <class 'int'>, 'return': None} "
                        f"['scripts/main_globals.py', 'x'] {SCRIPTS}")
    # a thread still running and an atexit handler pickle a class of the script's __main__
    assert lines[-2:] == ["thread True True", "atexit True True"]


def _package(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import sys\nprint(sys.argv, __name__, __package__, __spec__.name, sys.path[0])\n")
    (tmp_path / "localmod.py").write_text("import sys\nprint(__spec__.name, sys.path[0])\n")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_attached_module_and_dashes_end_run_s_options(tmp_path: Path) -> None:
    _package(tmp_path)
    plain = python("-m", "pkg.train", "a", "--json", cwd=tmp_path)
    attached = python(*_RUN, "--json", "r.json", "-mpkg.train", "a", "--json", cwd=tmp_path)
    assert plain.returncode == attached.returncode == 0, attached.stderr.decode()
    assert attached.stdout == plain.stdout
    assert read_report(tmp_path / "r.json")["argv"] == ["-m", "pkg.train", "a", "--json"]
    # after --, the script (here one whose name starts with a dash) and its arguments
    (tmp_path / "-dash.py").write_text("import sys\nprint(sys.argv)\n")
    plain = python("--", "-dash.py", "--depth", cwd=tmp_path)
    done = python(*_RUN, "--depth", "2", "--", "-dash.py", "--depth", cwd=tmp_path)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout == b"['-dash.py', '--depth']\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_console_script_runs_a_module_of_the_current_folder(tmp_path: Path) -> None:
    command = Path(sys.executable).parent / "asyncthrottle"
    if not command.exists():
        pytest.skip("the asyncthrottle console script is not installed")
    _package(tmp_path)
    plain = python("-m", "localmod", cwd=tmp_path)
    done = subprocess.run([str(command), "run", "-m", "localmod"], cwd=tmp_path, env=env(),
                          capture_output=True, timeout=300, check=False)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout == f"localmod {tmp_path}\n".encode()


_SHOW = "import sys\nprint(__name__, __file__, __spec__.name, __package__ == '', sys.path[0], " \
        "sys.argv)\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_folder_and_a_zipapp_run_their_main_as_python_runs_them(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(_SHOW)
    zipapp.create_archive(tmp_path / "app", tmp_path / "app.pyz")
    for target in ("app", "app.pyz"):
        plain, done = _both(target, "a", cwd=tmp_path, fresh=True)
        assert plain.returncode == done.returncode == 0, done.stderr.decode()
        assert done.stdout == plain.stdout
        assert done.stdout.decode().startswith(f"__main__ {tmp_path / target / '__main__.py'} ")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_safe_path_leaves_sys_path_alone(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("-P is python 3.11's")
    (tmp_path / "show.py").write_text("import sys\nprint(sys.path[0])\n")
    plain, done = pair(("-P", "show.py"), ("-P", *_RUN, "show.py"), cwd=tmp_path)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout and str(tmp_path).encode() not in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_relative_outputs_land_where_the_command_was_typed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "elsewhere").mkdir()
    done = python(*_RUN, "--json", "r.json", "--trace", "t.json", str(SCRIPTS / "chdir_outputs.py"),
                  "elsewhere", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == b"elsewhere\n", done.stderr.decode()
    report = read_report(tmp_path / "r.json")
    assert report["trace"] == {"path": str(tmp_path / "t.json"), "written": True}
    assert report["steps"] == 2 and (tmp_path / "t.json").exists()
    assert not (tmp_path / "elsewhere" / "r.json").exists()
    # the trace file gets the mode the JSON gets (the umask's), not mkstemp's 0600
    modes = {stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in ("r.json", "t.json")}
    assert len(modes) == 1


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--json", "no_folder/r.json", "is in a folder that does not exist"),
    ("--trace", ".", "is a folder; name a file in it"),
])
def test_a_bad_output_path_is_a_usage_error_before_the_script_runs(
        option: str, value: str, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("print('ran')\n")
    with pytest.raises(SystemExit) as info:
        main([option, value, "script.py"])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert f"{option} {value!r} {said}" in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_output_is_a_usage_error(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(SystemExit) as info:
        main(["--json", str(locked / "r.json"), "script.py"])
    assert info.value.code == 2 and "cannot be written here" in capsys.readouterr().err


def test_no_trace_is_written_without_steps_and_the_report_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(SCRIPTS)
    trace = tmp_path / "t.json"
    assert main(["--json", str(tmp_path / "r.json"), "--trace", str(trace), "never_trains.py",
                 "0"]) == 0
    assert not trace.exists()
    report = read_report(tmp_path / "r.json")
    assert report["trace"] == {"path": str(trace), "written": False}
    assert main(["--json", str(tmp_path / "r.json"), "never_trains.py", "0"]) == 0
    assert read_report(tmp_path / "r.json")["trace"] is None
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ctrl_c_runs_atexit_and_ends_the_daemonic_children_then_dies_by_sigint(
        tmp_path: Path) -> None:
    plain, done = pair(("ctrl_c_atexit.py", str(tmp_path / "plain")),
                       (*_RUN, "ctrl_c_atexit.py", str(tmp_path / "run")), fresh=True)
    assert plain.returncode == done.returncode == -signal.SIGINT, done.stderr.decode()
    # the atexit checkpoint was written after the report
    assert (tmp_path / "plain").read_text() == (tmp_path / "run").read_text() == "saved\n"
    # multiprocessing's exit cleanup ended the child (else the pipe stays open: no EOF above)
    with pytest.raises(ProcessLookupError):
        os.kill(int(done.stdout.split()[0]), 0)
    assert _before_report(done.stderr) == plain.stderr.decode()
    assert "KeyboardInterrupt" not in _report_of(done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_report_waits_for_the_script_s_threads() -> None:
    pytest.importorskip("torch")
    plain = python("thread_trains.py")
    done = subprocess.run([sys.executable, *_RUN, "thread_trains.py"], cwd=SCRIPTS, env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                          check=False)
    assert plain.returncode == done.returncode == 0, done.stdout.decode()
    both = done.stdout.decode()
    # the thread's lines (stdout, then the report on stderr, in one pipe) come before the report
    assert both.index("thread step 2") < both.index("asyncthrottle run")
    assert both[:both.index("asyncthrottle run")].encode() == plain.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thread_pool_left_open_ends_as_under_python() -> None:
    # python ends the pool's idle workers (threading's exit hooks) before it joins the threads;
    # a runner that only joins them waits forever
    pytest.importorskip("torch")
    plain, done = pair(("open_pool.py",), (*_RUN, "open_pool.py"), timeout=120)
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout == b"checkpoints [True, True, True, True]\n"
    assert _before_report(done.stderr) == plain.stderr.decode()
    assert "open_pool.py: 4 steps" in _report_of(done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["close", "replace"])
def test_a_script_that_closes_its_streams_keeps_its_exit_code(how: str) -> None:
    plain, done = _both("closes_streams.py", how)
    assert plain.returncode == done.returncode == 3, done.stderr.decode()
    assert done.stdout == plain.stdout == b"before\n"
    assert "exit code 3" in _report_of(done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tracebacks_have_no_runner_frame_in_the_whole_chain() -> None:
    pytest.importorskip("torch")
    plain, done = _both("raises_in_torch.py", fresh=True)
    assert plain.returncode == done.returncode == 1
    shown = _before_report(done.stderr)
    assert "asyncthrottle" not in shown and shown == plain.stderr.decode()


def _raised_through(script: Path, library: Path) -> BaseException:
    """The error that ``library``'s ``load()`` raises, called at ``script``'s line 2."""
    found: dict[str, object] = {}
    exec(compile("def load():\n    raise OSError('gone')\n", str(library), "exec"), found)
    try:
        exec(compile("x = 1\nload()\n", str(script), "exec"), found)
    except OSError as exc:
        return exc
    raise AssertionError("load() did not raise")


def test_a_raised_error_is_named_at_the_script_s_innermost_line_else_python_s_last(
        tmp_path: Path) -> None:
    from asyncthrottle.run.raised import raised

    script, library = tmp_path / "train.py", tmp_path / "lib" / "data.py"
    exc = _raised_through(script, library)
    assert raised(exc, str(script), started=True) == {
        "type": "OSError", "message": "gone", "site": "train.py:2", "started": True}
    # no frame of the script: the traceback's innermost line, relative to the script's folder
    assert raised(exc, str(tmp_path / "other.py"), started=True)["site"] == "lib/data.py:2"
    assert raised(exc, None, started=True)["site"] == f"{library}:2"
    long = raised(ValueError("x" * 300 + "\nmore"), None, started=True)
    assert long["message"] == "x" * 197 + "..." and long["site"] is None
