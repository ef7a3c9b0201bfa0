"""tests/forked.py, the suite's fork server: a forked command behaves as the same command in a fresh
interpreter, where the suite relies on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import forked
import pytest

pytest.importorskip("torch")

_SHOW = """\
import atexit, os, sys, threading
atexit.register(lambda: print("atexit", flush=True))
print(sorted(k for k in globals() if k != "atexit"), __name__, sys.argv[1:], flush=True)
print(sys.path[0] == os.path.dirname(os.path.realpath(__file__)), os.getcwd(), flush=True)
print(os.environ.get("ONLY_HERE"), "torch" in sys.modules, flush=True)
threading.Thread(target=lambda: print("thread joined", flush=True)).start()
sys.exit(int(sys.argv[1]))
"""


def _both(args: list[str], cwd: Path, **env: str) -> tuple[subprocess.CompletedProcess[bytes],
                                                              subprocess.CompletedProcess[bytes]]:
    full = {**forked._server_env(), **env}
    # the fresh side is the reference: a subprocess is the point of this test
    return (forked.run(args, cwd=cwd, env=full, timeout=120),
            forked.run(args, cwd=cwd, env=full, timeout=120, fresh=True))


def test_a_script_runs_as_in_a_fresh_interpreter_but_torch_already_imported(tmp_path: Path) -> None:
    (tmp_path / "show.py").write_text(_SHOW)
    fork, fresh = _both(["show.py", "3", "x"], tmp_path, ONLY_HERE="yes")
    assert fork.returncode == fresh.returncode == 3
    assert fork.stderr == fresh.stderr == b""
    assert fork.stdout.replace(b"yes True", b"yes False") == fresh.stdout
    assert fork.stdout.endswith(b"thread joined\natexit\n")


def test_c_m_and_an_uncaught_exception_as_python_has_them(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("import sys\nprint(sys.argv, __name__)\nraise KeyError('k')\n")
    for args in (["-m", "mod", "a"], ["-c", "import sys; print(sys.argv, sys.path[0]); 1/0", "b"]):
        fork, fresh = _both(args, tmp_path)
        assert fork.returncode == fresh.returncode == 1
        assert (fork.stdout, fork.stderr) == (fresh.stdout, fresh.stderr)


def test_what_a_fork_cannot_give_starts_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = "import sys; print('torch' in sys.modules)"
    assert forked.run(["-c", code]).stdout == b"True\n"
    # an option python reads at its start; an environment torch reads when imported
    assert forked.run(["-W", "error", "-c", code]).stdout == b"False\n"
    assert forked.run(["-c", code], env={**forked._server_env(), "OMP_NUM_THREADS": "2"}
                      ).stdout == b"False\n"
    assert forked.run(["-c", code], fresh=True).stdout == b"False\n"


def test_a_timeout_kills_the_fork_and_its_children() -> None:
    # a child and a grandchild that wait for a signal (the kill) forever
    code = ("import signal, subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
            "signal.pause()\n")
    process = forked.start(["-c", code])
    with pytest.raises(subprocess.TimeoutExpired):
        process.communicate(timeout=0.5)
    process.kill()
    assert process.wait(30) == -9
    assert sys.executable in process.args[0]
