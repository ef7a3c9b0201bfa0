"""Running a script, a module, a folder or a zipapp as ``__main__``, as ``python`` would."""

from __future__ import annotations

import builtins
import importlib.util
import itertools
import os
import sys
import threading
import traceback
import types
from importlib.machinery import ModuleSpec, PathFinder, SourceFileLoader
from pathlib import Path
from typing import Any

from .raised import raised

__all__ = ["Ending", "hide_runner_frames", "locate", "run", "say", "set_path0"]

# the frames of the runner's own files are left out of a script's tracebacks
_RUNNER = os.path.dirname(os.path.realpath(__file__))

# the modules that ``__main__`` replaced (kept alive: the runner's frames still use their globals)
_REPLACED: list[types.ModuleType] = []


class Ending:
    """How the script ended: its exit ``code``, whether by Ctrl-C, the ``file`` that ran (None
    where it never started) and, where it ended by an uncaught exception, what it ``raised``
    (:func:`~.raised.raised`; None otherwise)."""

    def __init__(self, code: int, interrupted: bool = False, file: str | None = None,
                 raised: dict[str, Any] | None = None) -> None:
        self.code, self.interrupted, self.file = code, interrupted, file
        self.raised = raised

    def exit(self) -> int:
        """Return the exit code; after Ctrl-C raise ``KeyboardInterrupt`` (its traceback already
        printed), so that Python joins the threads, runs the ``atexit`` handlers and ends the
        process by SIGINT, as after the script's own uncaught Ctrl-C.

        Raises:
            KeyboardInterrupt: the script was interrupted.
        """
        if not self.interrupted:
            return self.code
        again = KeyboardInterrupt()
        sys.excepthook = _Quiet(sys.excepthook, again)
        raise again


class _Quiet:
    """A ``sys.excepthook`` that prints nothing for one exception (printed already) and hands
    any other to the hook it replaced."""

    def __init__(self, previous: Any, exc: BaseException) -> None:
        self.previous, self.exc = previous, exc

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        sys.excepthook = self.previous
        if value is not self.exc:
            self.previous(kind, value, tb)


def _is_path_entry(target: str) -> bool:
    """A folder or a zip file: python runs the ``__main__.py`` in it."""
    if os.path.isdir(target):
        return True
    import zipfile

    return os.path.isfile(target) and zipfile.is_zipfile(target)


def set_path0(target: str, module: bool) -> None:
    """Put the target's entry first on ``sys.path`` where python puts it: the script's folder,
    the working directory for ``-m``, the folder or zipapp itself; nothing under ``-P``
    (``sys.flags.safe_path``) but a folder's or zipapp's own entry."""
    safe = bool(getattr(sys.flags, "safe_path", False))
    if not module and _is_path_entry(target):
        entry = os.path.abspath(target)
    elif safe:
        return
    else:
        entry = os.getcwd() if module else os.path.dirname(os.path.realpath(target))
    if safe or not sys.path:
        sys.path.insert(0, entry)
    else:
        sys.path[0] = entry


def locate(target: str, module: bool) -> str:
    """The file that runs (without importing anything): the script as typed, the module's file
    (for a submodule of a package not imported yet: the package's), the folder's or zipapp's
    ``__main__.py``. Raises ``FileNotFoundError`` (a script) or ``ModuleNotFoundError`` (a
    module, folder or zipapp) with Python's own words."""
    if module:
        return _module_file(target)
    if _is_path_entry(target):
        spec = PathFinder.find_spec("__main__", [os.path.abspath(target)])
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"can't find '__main__' module in "
                                      f"{os.path.abspath(target)!r}")
        return spec.origin
    if not os.path.isfile(target):
        raise FileNotFoundError(f"can't open file {os.path.abspath(target)!r}: [Errno 2] No such "
                                "file or directory")
    return target


def _module_file(name: str) -> str:
    parent = name.rpartition(".")[0]
    known = name if not parent or parent in sys.modules else name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(known)
    except (ImportError, ValueError) as exc:
        raise ModuleNotFoundError(f"No module named {name!r} ({exc})") from None
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}")
    if spec.origin is not None and spec.has_location:
        return spec.origin
    folders = list(spec.submodule_search_locations or ())
    return os.path.join(folders[0], "__init__.py") if folders else name


def run(target: str, args: list[str], module: bool) -> Ending:
    """Run ``target`` as ``__main__`` with ``sys.argv`` set as python would (``sys.path[0]``:
    :func:`set_path0`); print its uncaught exception as python does, without the runner's
    frames; then wait for its non-daemon threads. ``sys.modules["__main__"]`` stays the
    script's."""
    main = types.ModuleType("__main__")
    # python's __main__ has these two before the code runs
    main.__dict__.update(__annotations__={}, __builtins__=builtins)
    ending = _execute(target, args, module, main)
    _wait_for_threads()
    return ending


def _execute(target: str, args: list[str], module: bool, main: types.ModuleType) -> Ending:
    try:
        code = _prepare(target, args, module, main)
    except _CannotRun as exc:
        say(f"python -m asyncthrottle run: {exc}\n")
        return Ending(1, raised=raised(None, None, started=False))
    except BaseException as exc:  # before its first line: it does not compile (a SyntaxError)
        return _ended(exc, main, started=False)
    try:
        _REPLACED.append(sys.modules["__main__"])
        sys.modules["__main__"] = main
        exec(code, main.__dict__)
    except BaseException as exc:
        return _ended(exc, main, started=True)
    return Ending(0, file=main.__dict__.get("__file__"))


def _ended(exc: BaseException, main: types.ModuleType, *, started: bool) -> Ending:
    """The ending of a script that raised ``exc`` (printed as python prints it); ``raised`` for
    any error but Ctrl-C."""
    file = main.__dict__.get("__file__")
    if isinstance(exc, SystemExit):
        return Ending(_exit_code(exc.code), file=file)
    _print(exc)
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: the user's stop, not the script's error
        return Ending(130, interrupted=True, file=file)
    return Ending(1, file=file, raised=raised(exc, file, started=started))


class _CannotRun(Exception):
    """The module, folder or zipapp has nothing to run (python's message, status 1)."""


def _prepare(target: str, args: list[str], module: bool, main: types.ModuleType
             ) -> types.CodeType:
    """Fill ``main``'s globals as python does and return the code to run in it; sets
    ``sys.argv``."""
    if not module and not _is_path_entry(target):
        sys.argv = [target, *args]
        return _script(target, main)
    spec = _module_spec(target) if module else _main_of(target)
    sys.argv = [(spec.origin or target) if module else target, *args]
    get_code = getattr(spec.loader, "get_code", None)
    code = get_code(spec.name) if get_code is not None else None
    if code is None:
        raise _CannotRun(f"No code object available for {spec.name}")
    main.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __loader__=spec.loader,
                         __package__=spec.parent, __spec__=spec)
    return code  # type: ignore[no-any-return]


def _script(target: str, main: types.ModuleType) -> types.CodeType:
    path = os.path.abspath(target)
    main.__dict__.update(__loader__=SourceFileLoader("__main__", path), __file__=path,
                         __cached__=None)
    # bytes: the compiler decodes them as python decodes a script (BOM, coding cookie); none of
    # the runner's __future__ imports apply
    return compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)


def _module_spec(name: str) -> ModuleSpec:
    """``python -m name``'s spec (importing the parent packages, as python does)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise _CannotRun(f"Error while finding module specification for {name!r} "
                          f"({type(exc).__name__}: {exc})") from None
    if spec is None:
        raise _CannotRun(f"No module named {name}")
    if spec.submodule_search_locations is not None:
        if name.endswith(".__main__"):
            raise _CannotRun(f"Cannot use package as __main__ module ({name})")
        try:
            return _module_spec(name + ".__main__")
        except _CannotRun as exc:
            raise _CannotRun(f"{exc}; {name!r} is a package and cannot be directly "
                              "executed") from None
    return spec


def _main_of(target: str) -> ModuleSpec:
    entry = os.path.abspath(target)
    spec = PathFinder.find_spec("__main__", [entry])
    if spec is None:
        raise _CannotRun(f"can't find '__main__' module in {entry!r}")
    return spec


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status, as Python makes it (a message goes to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    say(f"{code}\n")
    return 1


def _print(exc: BaseException) -> None:
    """Print ``exc`` as Python would, without the runner's frames; through ``sys.excepthook``,
    which the script may have set."""
    hide_runner_frames(exc)
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    # a closed stderr, a broken hook: print it elsewhere
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:
        import traceback

        say("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _wait_for_threads() -> None:
    """Join the non-daemon threads, as python does at exit (a Ctrl-C stops the wait): first
    :func:`_threading_exit_hooks`, then the joins."""
    skip = {threading.current_thread(), threading.main_thread()}
    try:
        _threading_exit_hooks()
        while True:
            left = [t for t in threading.enumerate()
                    if t not in skip and not t.daemon and t.is_alive()]
            if not left:
                return
            for thread in left:
                thread.join()
    except KeyboardInterrupt:
        return


def _threading_exit_hooks() -> None:
    """Run the hooks that ``threading`` runs at exit before it joins the threads, as python
    does once the main thread's body has returned: ``concurrent.futures`` ends a pool's idle
    (non-daemon) workers there, so without them a script that leaves a ``ThreadPoolExecutor``
    open (inductor's compile workers do) would be waited for forever. Each runs once, last
    registered first: python's own call at exit finds none left. CPython keeps them in a
    private list (``threading._register_atexit``'s), read here because no public call runs
    them; a Python without it gets the joins alone. A hook that raises is printed (its
    traceback on stderr) and the others still run."""
    hooks = getattr(threading, "_threading_atexits", None)
    while hooks:
        hook = hooks.pop()
        try:
            hook()
        except Exception:
            traceback.print_exc()


def say(text: str) -> None:
    """Write ``text`` where it can go: ``sys.stderr``, else ``sys.__stderr__``, else fd 2 (the
    script may have closed or replaced the streams); never raises."""
    for stream in (sys.stderr, sys.__stderr__):
        # closed or broken: try the next
        try:
            if stream is not None:
                stream.write(text)
                stream.flush()
                return
        except Exception:
            continue
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def hide_runner_frames(exc: BaseException) -> None:
    """Unlink the runner's frames from the tracebacks of ``exc`` and of every exception chained
    to it (cause, context, an exception group's members)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        one.__traceback__ = _without_runner(one.__traceback__)
        todo += [e for e in (one.__cause__, one.__context__) if e is not None]
        members = getattr(one, "exceptions", None)
        if isinstance(members, tuple):
            todo += [e for e in members if isinstance(e, BaseException)]


def _without_runner(tb: types.TracebackType | None) -> types.TracebackType | None:
    kept = []
    while tb is not None:
        folder = os.path.dirname(tb.tb_frame.f_code.co_filename)
        if folder != _RUNNER and os.path.realpath(folder) != _RUNNER:
            kept.append(tb)
        tb = tb.tb_next
    for before, after in itertools.pairwise(kept):
        before.tb_next = after
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None
