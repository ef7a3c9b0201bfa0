"""How the command line was typed, for its usage and examples: ``asyncthrottle`` (the installed
command) or ``python -m asyncthrottle``."""

from __future__ import annotations

import os
import sys

# the installed command's file name (pyproject's [project.scripts]; on Windows, its .exe)
_INSTALLED = ("asyncthrottle", "asyncthrottle.exe")


def command(*words: str) -> str:
    """``asyncthrottle`` and ``words`` where the process was started by the installed command,
    else ``python -m asyncthrottle`` and ``words`` (``python -m`` makes ``sys.argv[0]`` the
    package's ``__main__.py``). Read at each call: call it before ``run`` hands ``sys.argv`` to
    the script."""
    typed = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    head = "asyncthrottle" if typed.lower() in _INSTALLED else "python -m asyncthrottle"
    return " ".join((head, *words))


def examples(*rows: tuple[str, str]) -> str:
    """An ``examples:`` block for a parser's epilog (``RawDescriptionHelpFormatter``): each row's
    words after :func:`command`, then its comment (none: ``""``), the comments aligned."""
    typed = [command(words) for words, _ in rows]
    width = max((len(line) for line, (_, why) in zip(typed, rows, strict=True) if why), default=0)
    lines = [f"  {line:<{width}}  # {why}" if why else f"  {line}"
             for line, (_, why) in zip(typed, rows, strict=True)]
    return "\n".join(["examples:", *lines]) + "\n"
