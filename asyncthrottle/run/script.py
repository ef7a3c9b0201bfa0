"""Running a script or a module as ``python SCRIPT ARGS`` (``python -m MODULE ARGS``) would."""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path
from types import TracebackType

__all__ = ["Ending", "locate", "run"]


class Ending:
    """How the script ended: its exit ``code`` and, for Ctrl-C, the interrupt to end the process
    with once the report is out."""

    def __init__(self, code: int, interrupted: bool = False) -> None:
        self.code, self.interrupted = code, interrupted

    def exit(self) -> int:
        """Return the exit code; after Ctrl-C, end the process as Python does (by SIGINT)."""
        if self.interrupted:
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return self.code


def locate(target: str, module: bool) -> str:
    """The file that runs: the script's path, or the module's; raises ``FileNotFoundError``
    (a script) or ``ModuleNotFoundError`` (a module) with Python's own words."""
    if module:
        import importlib.util

        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            raise ModuleNotFoundError(f"No module named {target!r} ({exc})") from None
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"No module named {target!r}")
        if spec.submodule_search_locations is not None:
            return locate(target + ".__main__", True)
        return spec.origin
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"can't open file {str(path.resolve())!r}: [Errno 2] No such file "
                                "or directory")
    return str(path)


def run(target: str, args: list[str], module: bool) -> Ending:
    """Run ``target`` as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set as Python would;
    its exceptions are printed with their traceback (from the script's first frame), as Python
    prints them."""
    argv, path0 = sys.argv, sys.path[0] if sys.path else None
    file = locate(target, module)
    sys.argv = [file if module else target, *args]
    if not module:
        # the script's folder first, where python SCRIPT puts it (python -m: the cwd, as now)
        sys.path[0] = str(Path(file).resolve().parent)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(file, run_name="__main__")
    except SystemExit as exc:
        return Ending(_exit_code(exc.code))
    except KeyboardInterrupt as exc:
        _print(exc, file)
        return Ending(130, interrupted=True)
    except BaseException as exc:
        _print(exc, file)
        return Ending(1)
    finally:
        sys.argv = argv
        if path0 is not None:
            sys.path[0] = path0
    return Ending(0)


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status, as Python makes it (a message goes to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print(exc: BaseException, file: str) -> None:
    """Print ``exc`` as Python would, its traceback starting at the script's first frame (the
    runner's frames left out); through ``sys.excepthook``, which the script may have set."""
    exc.__traceback__ = _from_script(exc.__traceback__, file)
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _from_script(tb: TracebackType | None, file: str) -> TracebackType | None:
    target = os.path.realpath(file)
    start = tb
    while start is not None:
        if os.path.realpath(start.tb_frame.f_code.co_filename) == target:
            return start
        start = start.tb_next
    # no frame of the script (a SyntaxError): Python prints none either
    return None
