"""The report's files: ``--json``, ``--html``, ``--suggest``'s patch, each written or said why
not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .patchfile import patches as rewrites
from .script import say

__all__ = ["suggest", "write"]


def write(option: str, path: str | None, made: Callable[[], str]) -> None:
    """Write ``made()`` to ``option``'s file (None: not asked for); a file that cannot be written
    is said, and the report goes on."""
    if path is None:
        return
    try:
        Path(path).write_text(made(), encoding="utf-8")
    except OSError as exc:
        say(f"python -m asyncthrottle run: {option} {path!r} could not be written ({exc})\n")


def suggest(data: dict[str, Any], root: str) -> str:
    """The report's ``patches`` (:func:`~.patchfile.patches`, each sync site's in ``root``);
    returns the patch of the certain rewrites (``""``: none). A failure is said, and the report
    goes on without them."""
    try:
        data["patches"], patch = rewrites(data["syncs"], root)
    except Exception as exc:  # the report matters more than its patches
        say(f"python -m asyncthrottle run: the suggested rewrites failed ({exc!r}); please "
            "report it\n")
        data["patches"], patch = [], ""
    return patch
