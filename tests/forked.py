"""``python ARGS`` as a process forked from a server that has already imported torch.

Most of the suite's end-to-end tests start a Python process that imports torch (1.8-2.1 s of the
2-core machine's CPU each, more than most of those scripts then take to train; Dynamo, which a
script's first optimizer imports, a second more). A server, started once a test process (each
pytest-xdist worker), imports torch (and Dynamo: :data:`TORCH`) once; each run is a fork of it
(``os.fork``: milliseconds), which then runs the command as ``python`` would: ``SCRIPT ARGS``,
``-m MODULE ARGS`` or ``-c CODE ARGS``, in ``__main__``, with the request's argv, environment,
working folder, ``sys.path`` and standard streams, ending by Python's own shutdown (non-daemon
threads joined, ``atexit``, the exit code, death by SIGINT after Ctrl-C). It is what
``multiprocessing.set_forkserver_preload(["torch"])`` gives multiprocessing's children.

What a fork cannot give, :func:`run` and :func:`start` give by starting a fresh interpreter:

- an environment that differs from the server's in what Python or torch read when they start
  (``PYTHON*`` but ``PYTHONPATH``, ``OMP_*``, ``CUDA_*``, ``TORCH*``, ...: :data:`_READ_AT_START`);
- interpreter options other than ``-c``/``-m`` (``-W error``, ``-X``, ``-u``, ...);
- ``fresh=True``: a test about what a fresh process shows (``torch`` not yet imported, the order
  in which the script imports it, signals sent to a process group, tracebacks frame by frame).

Without ``os.fork`` (not on Linux or macOS) everything runs fresh.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["TORCH", "Forked", "run", "start"]

# what the server imports by default: torch, and Dynamo, which every script that makes an
# optimizer imports (torch.optim's constructor does, through torch/_compile.py): about a second of
# CPU a run, more than most of the suite's scripts then take to train
TORCH = ("torch", "torch._dynamo")

# what Python, OpenMP or torch read once, when the interpreter starts or torch is imported
_READ_AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "CUDA_", "PYTORCH_", "TORCH", "LD_",
                  "NVIDIA_", "MALLOC_", "ASYNCTHROTTLE_FRESH")
# what the fork applies itself (tests/_forkserver.py)
_APPLIED = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"}
_HERE = Path(__file__).resolve().parent
_SERVER = f"import sys; sys.path.insert(0, {str(_HERE)!r}); import _forkserver; _forkserver.main()"


class Forked:
    """A command forked from the server: ``communicate``, ``wait``, ``kill`` as
    :class:`subprocess.Popen` has them, and ``args``, ``pid``, ``returncode``."""

    def __init__(self, args: list[str], control: socket.socket, out: int, err: int) -> None:
        self.args, self._control = args, control
        self.pid = int(_line(control))
        self.returncode: int | None = None
        self._pipes = {out: bytearray(), err: bytearray()}
        self._out, self._err = out, err

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Read stdout and stderr to their end and wait for the exit code, as
        :meth:`subprocess.Popen.communicate` does (``TimeoutExpired`` after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in self._pipes:
                selector.register(fd, selectors.EVENT_READ)
            selector.register(self._control, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in selector.select(left):
                    self._read(selector, key.fd)
        return bytes(self._pipes[self._out]), bytes(self._pipes[self._err])

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: the signal that ended it), once both streams are read."""
        self.communicate(timeout)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL to the command's process group (it leads one of its own)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _read(self, selector: selectors.BaseSelector, fd: int) -> None:
        if fd == self._control.fileno():
            selector.unregister(fd)
            self.returncode = int(_line(self._control))
            self._control.close()
            return
        chunk = os.read(fd, 65536)
        if chunk:
            self._pipes[fd] += chunk
        else:
            selector.unregister(fd)
            os.close(fd)


def start(args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
          env: Mapping[str, str] | None = None, fresh: bool = False,
          preload: Sequence[str] = TORCH) -> Forked | subprocess.Popen[bytes]:
    """``python ARGS`` started with its stdout and stderr piped: forked from a server that has
    imported ``preload`` where a fork runs it as a fresh interpreter would (see the module's
    docstring), else a fresh one. Preload only what the command imports itself (a framework's
    script: ``("torch", "lightning")``): what is imported before a script starts is not what it
    imported."""
    env = dict(os.environ if env is None else env)
    cwd = os.fspath(cwd if cwd is not None else os.getcwd())
    if fresh or not _forkable(list(args), env):
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    return _server(tuple(preload)).fork(list(args), cwd, env)


def run(args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, timeout: float | None = None, text: bool = False,
        check: bool = False, fresh: bool = False, preload: Sequence[str] = TORCH
        ) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run` of ``[sys.executable, *args]`` with its output captured, forked
    from a server where it can be (:func:`start`)."""
    process = start(args, cwd=cwd, env=env, fresh=fresh, preload=preload)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    done: subprocess.CompletedProcess[Any] = subprocess.CompletedProcess(
        [sys.executable, *args], process.returncode or 0, out, err)
    if text:
        done.stdout, done.stderr = out.decode(), err.decode()
    if check:
        done.check_returncode()
    return done


def _forkable(args: list[str], env: dict[str, str]) -> bool:
    if not hasattr(os, "fork") or not args:
        return False
    if args[0].startswith("-") and args[0] not in ("-c", "-m"):
        return False
    server_env = _server_env()
    keys = {key for key in set(env) | set(server_env) if key.startswith(_READ_AT_START)}
    keys -= _APPLIED
    return all(env.get(key) == server_env.get(key) for key in keys)


def _server_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


class _Server:
    """A forking server: a child of this process that has imported ``preload`` and listens on a
    Unix socket; it exits when this process closes its stdin (this process ending included)."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        folder = tempfile.mkdtemp(prefix="forkserver-")
        self.path = os.path.join(folder, "socket")
        self.process = subprocess.Popen([sys.executable, "-c", _SERVER, self.path, *preload],
                                         env=_server_env(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        # the server says "ready" once it has imported its modules and its socket listens
        if self.process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()})")
        atexit.register(self.close)

    def fork(self, args: list[str], cwd: str, env: dict[str, str]) -> Forked:
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control.connect(self.path)
            request = json.dumps({"args": args, "cwd": cwd, "env": env}).encode()
            socket.send_fds(control, [request + b"\n"], [out_w, err_w])
        finally:
            os.close(out_w)
            os.close(err_w)
        return Forked([sys.executable, *args], control, out_r, err_r)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(30)


_lock = threading.Lock()
_servers: dict[tuple[str, ...], _Server] = {}


def _server(preload: tuple[str, ...]) -> _Server:
    with _lock:
        server = _servers.get(preload)
        if server is None or server.process.poll() is not None:
            server = _servers[preload] = _Server(preload)
        return server


def _line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        # a byte at a time: the exit code's line may follow the pid's in the same packet
        chunk = connection.recv(1)
        if not chunk:
            raise RuntimeError(f"the fork server closed the connection ({data!r})")
        data += chunk
    return data.decode().strip()
