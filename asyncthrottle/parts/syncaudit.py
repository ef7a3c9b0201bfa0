"""The sync audit: counts CUDA's sync warnings on the loop's thread, per step, by the site that
synced."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any, cast

__all__ = ["SYNC_MESSAGE", "SyncAdvice", "SyncAudit", "short_path", "site_of"]

# what torch warns with under set_sync_debug_mode("warn")
SYNC_MESSAGE = "called a synchronizing CUDA operation"
_HERE = os.path.abspath(__file__)
_SKIPPED_FILES = {_HERE, os.path.abspath(warnings.__file__)}


class SyncAdvice(UserWarning):
    """A framework setting that makes every step sync (an integration warns once, with the fix)."""


class SyncAudit:
    """Counts the syncs CUDA's sync debug mode reports on one thread, and where they happen.

    ``start()`` opens a step's window (from its hand-out until the throttle
    next waits or drains), ``stop()`` closes it. While a window is open, every
    sync warning raised on the thread that opened it is counted under its
    site: the first stack frame outside torch, as ``file:line`` (the path
    relative to its ``sys.path`` entry, e.g. ``transformers/trainer.py:1921``).
    The first warning of each site is passed on to the previous warning
    handler; repeats are only counted. Warnings from other threads (the mode
    is process-global) are passed on and not counted.

    With ``on_sync``, each sync of an open window is told to it instead, with the frame that
    raised the warning (``on_sync(frame)``), and is neither counted here nor shown: its caller
    keeps its own counts.

    Attributes:
        steps: windows opened (steps audited).
        syncs: syncs counted on the loop's thread.
        sites: syncs counted per site.
    """

    def __init__(self, on_sync: Callable[[FrameType | None], None] | None = None) -> None:
        self._on_sync = on_sync
        self.steps = self.syncs = 0
        self.sites: Counter[str] = Counter()
        self._thread: int | None = None
        self._open = False
        self._shown: set[str] = set()
        self._previous: Any = None
        # one bound method, so `is`/`==` finds it again
        self._hook = self._show
        self._filter: Any = None
        # re-entered through a handler that wraps ours: pass straight on
        self._showing = False

    @property
    def syncs_per_step(self) -> float:
        """Syncs counted per step audited (0.0 before the first step)."""
        return self.syncs / self.steps if self.steps else 0.0

    def top(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` sites that sync most, with their syncs per step."""
        steps = max(self.steps, 1)
        return [(site, count / steps) for site, count in self.sites.most_common(n)]

    def summary(self, n: int = 3) -> str:
        """A few lines for ``Throttle.summary()``: syncs per step and the top sites."""
        return "\n".join(summary_lines(self.steps, self.syncs, self.syncs_per_step, self.top(n)))

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers for loggers: ``syncs_per_step`` and ``syncs_per_step/<site>`` for the top
        sites."""
        flat: dict[str, Any] = {"syncs_per_step": self.syncs_per_step}
        flat.update({f"syncs_per_step/{site}": rate for site, rate in self.top()})
        return flat

    # -- windows ---------------------------------------------------------------

    def start(self, new_step: bool = True, thread: int | None = None) -> None:
        """A step was handed out on this thread (or ``thread``, a ``threading.get_ident()``), or
        a wait inside it ended: count its syncs from now on."""
        if new_step:
            self.steps += 1
        self._thread = threading.get_ident() if thread is None else thread
        self._open = True
        self._install()

    def stop(self) -> None:
        """The step's window closes (the throttle is about to wait or drain)."""
        self._open = False

    def install(self) -> None:
        """Put the hook and filter back if the script's ``catch_warnings`` or
        ``filterwarnings`` moved them (the filter first again)."""
        filters = cast(list[Any], warnings.filters)
        if self._filter is not None and filters[:1] != [self._filter]:
            if self._filter in filters:
                filters.remove(self._filter)
            self._filter = None
        self._install()

    def uninstall(self) -> None:
        """Close the window and take the hook and filter away (the previous hook back)."""
        self.stop()
        if warnings.showwarning == self._hook:
            warnings.showwarning = self._previous
        filters = cast(list[Any], warnings.filters)
        if self._filter in filters:
            # an "always" filter never writes a warning registry: removing it leaves no entry
            # that the filters' version would have to invalidate
            filters.remove(self._filter)
        self._filter = None

    def _install(self) -> None:
        """Put the hook and an ``always`` filter in place (again, if a ``catch_warnings`` block
        removed them)."""
        if warnings.showwarning != self._hook:
            self._previous = warnings.showwarning
            warnings.showwarning = self._hook
        if self._filter is None or self._filter not in warnings.filters:
            # Without it, Python shows a warning once per call site and the repeats are never seen.
            warnings.filterwarnings("always", message=SYNC_MESSAGE, category=UserWarning)
            self._filter = warnings.filters[0]

    def _show(self, message: Any, category: type[Warning], filename: str, lineno: int,
              file: Any = None, line: Any = None) -> None:
        original = warnings._showwarning_orig  # type: ignore[attr-defined]
        if self._showing:
            original(message, category, filename, lineno, file, line)
            return
        previous = self._previous or original
        if self._open and threading.get_ident() == self._thread and _is_sync(message, category):
            if self._on_sync is not None:
                self._on_sync(sys._getframe(1))
                return
            site = self._count(sys._getframe(1))
            if site in self._shown:
                return
            self._shown.add(site)
            message = category(f"{message} [asyncthrottle: site {site}]")
        self._showing = True
        try:
            previous(message, category, filename, lineno, file, line)
        finally:
            self._showing = False

    def _count(self, frame: FrameType | None) -> str:
        """Counts one sync of the loop's thread made at ``frame``; returns its site."""
        site = site_of(frame)
        self.syncs += 1
        self.sites[site] += 1
        return site


def summary_lines(steps: int, syncs: int, per_step: float,
                  top: list[tuple[str, float]]) -> list[str]:
    """The summary's lines of an audit: syncs per step over ``steps`` steps, then the ``top`` sites
    with their syncs per step."""
    if not syncs:
        return [f"  syncs (detect_sync): none seen on the loop's thread in {steps} steps"]
    return [f"  syncs (detect_sync): {per_step:.1f}/step on the loop's thread over {steps} steps",
            *(f"    {rate:.1f} syncs/step \u2014 {site}" for site, rate in top)]


def _is_sync(message: Any, category: type[Warning]) -> bool:
    return issubclass(category, UserWarning) and str(message).startswith(SYNC_MESSAGE)


def site_of(frame: FrameType | None) -> str:
    """``file:line`` of the first frame outside torch, the warnings machinery and this module."""
    torch = sys.modules.get("torch")
    torch_dir = (
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        if torch and torch.__file__
        else None
    )
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in _SKIPPED_FILES and not (torch_dir and path.startswith(torch_dir)):
            return f"{short_path(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def short_path(path: str) -> str:
    """``path`` relative to the longest ``sys.path`` entry (or the working directory) that holds
    it."""
    roots = [os.path.abspath(entry or os.curdir) for entry in sys.path] + [os.getcwd()]
    best = ""
    for root in roots:
        root = root.rstrip(os.sep) + os.sep
        if path.startswith(root) and len(root) > len(best):
            best = root
    return path[len(best):] if best else os.path.basename(path)
