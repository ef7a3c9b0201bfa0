"""Reading a run report (``run --json``'s file) for ``compare``: checked against its schema, and
refused with a message naming the file and the fix where it is none (no file, not JSON, another
schema, a number no report holds, JSON nested too deep)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .report import SCHEMA, schema
from .validate import problems

__all__ = ["ReportError", "load"]

_WRITE = "the file python -m asyncthrottle run --json PATH SCRIPT wrote"


class ReportError(ValueError):
    """A file that is no run report this version can compare; the message names the file and
    what to pass instead."""


def load(path: str, which: str) -> dict[str, Any]:
    """The run report at ``path`` (``which``: ``"BEFORE"`` or ``"AFTER"``, for the messages),
    checked against ``report.schema.json``.

    Raises:
        ReportError: no such file, not JSON, JSON nested too deep, a number no report holds
            (NaN, an infinity, an integer beyond 64 bits), JSON that is not a run report, or a
            schema number this version does not read.
    """
    said = f"{which} {path!r}"
    file = Path(path)
    if file.is_dir():
        raise ReportError(f"{said} is a folder: pass {_WRITE}")
    try:
        raw = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{said} does not exist: pass {_WRITE}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{said} cannot be read ({exc}): pass {_WRITE}") from None
    try:
        report = json.loads(raw, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{said} is not JSON ({exc}): pass {_WRITE}, not its text "
                          "report") from None
    except RecursionError:
        raise ReportError(f"{said} is JSON nested too deep to read (no run report nests more "
                          f"than a few levels): pass {_WRITE}") from None
    except _BadNumber as exc:
        raise ReportError(f"{said} holds {exc}, which no run report holds: pass {_WRITE}, "
                          "unchanged") from None
    if not isinstance(report, dict) or "schema" not in report:
        what = ("a trace (run --trace), not a report" if isinstance(report, dict)
                and "traceEvents" in report else 'JSON but not a run report (no "schema" key)')
        raise ReportError(f"{said} is {what}: pass {_WRITE}")
    if report["schema"] != SCHEMA or isinstance(report["schema"], bool):
        from .. import __version__

        raise ReportError(f"{said} has schema {report['schema']!r}, and asyncthrottle "
                          f"{__version__} reads schema {SCHEMA}: compare it with the asyncthrottle "
                          "that wrote it, or run the script again under this one")
    try:
        found = problems(report, schema())
    except RecursionError:
        found = ["it is nested too deep to check"]
    if found:
        raise ReportError(f"{said} is not a run report of schema {SCHEMA} ({'; '.join(found)}): "
                          f"pass {_WRITE}, unchanged")
    return report


class _BadNumber(ValueError):
    """A number no run report holds: NaN, an infinity, an integer beyond 64 bits."""


def _constant(name: str) -> float:
    raise _BadNumber(f"{name} (JSON has no {name}; a report writes null for a value that is not "
                     "finite)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(f"the number {text[:40]} (beyond a float's range)")
    return value


def _int(text: str) -> int:
    # 20 characters hold every 64-bit integer with its sign: no longer text is converted (Python
    # refuses more than 4,300 digits with a ValueError of its own)
    value = int(text) if len(text) <= 20 else None
    if value is None or not -2**63 <= value < 2**63:
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"
        raise _BadNumber(f"the integer {shown} (beyond 64 bits)")
    return value
