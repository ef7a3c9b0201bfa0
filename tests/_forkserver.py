"""The server of :mod:`forked`: imports the modules its command line names (torch, a framework),
then forks one child a request, and in that child runs the request's command as ``python`` would.

Single-threaded on purpose (a fork from a process with threads may inherit a lock held by one):
one ``select`` loop over the listening socket, the open requests, SIGCHLD's wake-up pipe and stdin
(closed by the test process when it ends, or by its death)."""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib
import importlib.machinery
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import types
import zipfile
from typing import Any


def main() -> None:
    # the point of the server: every child starts with these imported
    for name in sys.argv[2:]:
        importlib.import_module(name)
    # what is imported now, the collector leaves alone in every child (gc.freeze is made for a
    # server that forks): a collection would write to each object's pages, copies of the server's
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # sys.path as this interpreter set it, less its own first entry and PYTHONPATH's
    base = _site_path()
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener, woken_r, sys.stdin], [], [])
        if sys.stdin in ready and not sys.stdin.buffer.read1(1):
            return
        if woken_r in ready:
            os.read(woken_r, 4096)
            _reap(waiting)
        if listener in ready:
            connection, _ = listener.accept()
            request = _receive(connection)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                os.close(woken_r)
                os.close(woken_w)
                _become(request, connection, base)
                return
            for fd in request["fds"]:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection
            _reap(waiting)


def _reap(waiting: dict[int, socket.socket]) -> None:
    for pid in list(waiting):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            connection = waiting.pop(pid)
            connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


def _receive(connection: socket.socket) -> dict[str, Any]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 2)
    while not data.endswith(b"\n"):
        data += connection.recv(1 << 20)
    request: dict[str, Any] = json.loads(data)
    request["fds"] = fds
    return request


def _site_path() -> list[str]:
    given = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    return [entry for entry in sys.path[1:] if entry not in given]


def _become(request: dict[str, Any], connection: socket.socket, base: list[str]) -> None:
    """In the child: the request's process state, then its command run in ``__main__``."""
    connection.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setpgrp()
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in zip((devnull, *request["fds"]), (0, 1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)  # type: ignore[attr-defined]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    # a fresh interpreter seeds these from the OS; a fork would repeat the server's
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    try:
        _run(request["args"], base)
    except SystemExit as ended:
        status = _status(ended.code)
    except KeyboardInterrupt:
        raise  # Python's own end: atexit, then death by SIGINT
    except BaseException as error:
        # Python's report of an uncaught exception, without this module's frames (on the
        # exception too: Python's own hook prints the exception's traceback where it has one)
        error.with_traceback(_without_ours(error.__traceback__))
        sys.excepthook(type(error), error, error.__traceback__)
        status = 1
    else:
        status = 0
    _end(status)


def _status(code: object) -> int:
    """The exit status of ``sys.exit(code)``, as Python gives it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _end(status: int) -> None:
    """Python's end of a process, less the teardown of its modules: non-daemon threads joined,
    atexit's handlers, open files flushed, then the status. A fork's teardown writes the
    reference count of every object the server imported (torch's: copies of their pages), which
    took 2 s a process; nothing the suite's scripts do at exit is left out but objects'
    ``__del__`` at the teardown (files are flushed here, as their teardown would)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for found in gc.get_objects():
        # by its type: isinstance() asks a dead weak proxy, which raises
        if issubclass(type(found), io.IOBase):
            with contextlib.suppress(Exception):
                if not found.closed:
                    found.flush()
    os._exit(status)


def _without_ours(tb: types.TracebackType | None) -> types.TracebackType | None:
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _run(args: list[str], base: list[str]) -> None:
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    option, rest = args[0], args[1:]
    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __builtins__=builtins, __doc__=None,
                         __package__=None, __spec__=None, __annotations__={})
    if option == "-m":
        sys.path[:] = [os.getcwd(), *given, *base]
        sys.argv = ["-m", *rest[1:]]
        runpy._run_module_as_main(rest[0], alter_argv=True)  # type: ignore[attr-defined]
    elif option == "-c":
        sys.path[:] = ["", *given, *base]
        sys.argv = ["-c", *rest[1:]]
        main.__dict__["__loader__"] = importlib.machinery.BuiltinImporter
        exec(compile(rest[0], "<string>", "exec"), main.__dict__)
    else:
        _run_script(main, option, rest, given, base)


def _run_script(main: types.ModuleType, script: str, rest: list[str], given: list[str],
                base: list[str]) -> None:
    path = os.path.abspath(script)
    sys.argv = [script, *rest]
    if os.path.isdir(path) or zipfile.is_zipfile(path):
        # a folder or a zip application: its __main__ module, found on the path it heads
        sys.path[:] = [script, *given, *base]
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    sys.path[:] = [os.path.dirname(os.path.realpath(path)), *given, *base]
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    main.__dict__.update(__file__=path, __loader__=loader, __cached__=None)
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)
