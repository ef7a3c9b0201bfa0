"""``os._exit`` while ``run`` runs a script: the process dies at once (no ``atexit``, no
``finally``), so the report is made inside the call, before it dies, and the guard's exit status
is the one it dies with."""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from ..audit.patches import Patches
from .script import say

__all__ = ["report_before_exit"]


def report_before_exit(patches: Patches, report: Callable[[int], int]) -> None:
    """Replace ``os._exit`` (``patches.undo()`` puts it back): in the runner's process, the
    first call makes the report, ``report(status)``, which returns run's exit status (the
    script's, or the guard's where the script exited 0 and the guard failed), and the process
    dies with that. Anywhere else it is ``os._exit`` itself: in a forked child (a
    ``multiprocessing`` worker, a DataLoader's, which end by ``os._exit``), on a status that is no
    integer (``os._exit`` raises its ``TypeError``), on a second call while the report is made
    (the process dies, as it would have). A report that fails is said; the script's status
    stands."""
    runner = os.getpid()
    once = threading.Lock()

    def make(original: Callable[[int], NoReturn]) -> Callable[[Any], NoReturn]:
        def _exit(status: Any) -> NoReturn:
            try:
                code = operator.index(status)
            except TypeError:
                original(status)
            if os.getpid() == runner and once.acquire(blocking=False):
                code = _reported(report, code)
            original(code)
        return _exit

    patches.replace(os, "_exit", make)


def _reported(report: Callable[[int], int], code: int) -> int:
    try:
        return report(code)
    except BaseException as exc:  # the process dies next: say why there is no report
        say(f"python -m asyncthrottle run: the report failed as the script called os._exit("
            f"{code}) ({exc!r}); please report it\n")
        return code
