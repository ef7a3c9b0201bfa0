"""What a script's uncaught exception was, for the report: its type, message, line, and whether
the script had started."""

from __future__ import annotations

import os
import types
from typing import Any

__all__ = ["raised"]

# a message longer than this is cut in the report (the traceback above holds it whole)
_LONGEST = 200


def raised(exc: BaseException | None, script: str | None, *, started: bool) -> dict[str, Any]:
    """The report's ``raised``: ``type`` (the exception's class name), ``message`` (its first line),
    ``site`` (``file.py:LINE``, relative to the script's folder: where Python names it, a
    ``SyntaxError``'s own line, else the script's innermost line in the traceback, else the
    traceback's innermost line; None where none is known) and ``started`` (False: the script's
    first line never ran, as when it does not compile).

    ``exc`` None: the runner found nothing to run (its message said why)."""
    if exc is None:
        return {"type": None, "message": None, "site": None, "started": started}
    message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    first = message.strip().partition("\n")[0]
    return {"type": type(exc).__name__,
            "message": first if len(first) <= _LONGEST else first[:_LONGEST - 3] + "...",
            "site": _site(exc, script), "started": started}


def _site(exc: BaseException, script: str | None) -> str | None:
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return _named(exc.filename, exc.lineno, script)
    frames = list(_frames(exc.__traceback__))
    own = [frame for frame in frames if script is not None and _same(frame[0], script)]
    found = (own or frames)[-1:]
    return _named(*found[0], script) if found else None


def _frames(tb: types.TracebackType | None) -> list[tuple[str, int]]:
    found = []
    while tb is not None:
        found.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return found


def _same(path: str, script: str) -> bool:
    return os.path.abspath(path) == os.path.abspath(script)


def _named(path: str, line: int, script: str | None) -> str:
    """``path:line``, relative to the script's folder where the file is below it."""
    if script is not None:
        folder = os.path.dirname(os.path.abspath(script))
        full = os.path.abspath(path)
        if full.startswith(folder + os.sep):
            path = os.path.relpath(full, folder)
    return f"{path}:{line}"
