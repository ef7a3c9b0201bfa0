"""Module paths that moved (in 0.3, and ``hooks`` in 0.4): each old path imports its new module
(most with a ``DeprecationWarning``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import FrameType, ModuleType

# Old path (under asyncthrottle) -> (new path, the release that moved it, or None: a public home
# kept on purpose, with no warning: the test devices and the probes users pass as ``memory=``). A
# moved path goes away one minor release after the one that moved it.
MOVED = {
    "simulated": ("testing.simulated", None),
    "procdevice": ("testing.procdevice", None),
    "memory": ("backends.memory", None),
    "syncaudit": ("parts.syncaudit", None),
    "completions": ("values", "0.3"),
    "deferred": ("values", "0.3"),
    "passes": ("view", "0.3"),
    "options": ("_options", "0.3"),
    "events": ("core.events", "0.3"),
    "waits": ("core.waits", "0.3"),
    "errors": ("core.errors", "0.3"),
    "ownership": ("core.ownership", "0.3"),
    "hosttime": ("core.hosttime", "0.3"),
    "telemetry": ("parts.timing", "0.3"),
    "controller": ("parts.autodepth", "0.3"),
    "prefetch": ("parts.prefetch", "0.3"),
    "stall": ("parts.stall", "0.3"),
    "ranks": ("parts.ranks", "0.3"),
    "trace": ("parts.trace", "0.3"),
    "profiling": ("parts.profiling", "0.3"),
    "progress": ("_progress", "0.3"),
    "syncdebug": ("parts.syncdetect", "0.3"),
    "devices": ("backends.torch", "0.3"),
    "pool": ("backends.pool", "0.3"),
    "copies": ("backends.copies", "0.3"),
    "pinned": ("backends.pinned", "0.3"),
    "bench.seed": ("bench.experiments", "0.3"),
    "bench.seed_values": ("bench.add_one_deferred", "0.3"),
    "bench.model": ("bench.cost_model", "0.3"),
    "bench.backend": ("bench.backends", "0.3"),
    # the framework callbacks' driver: "hooks" also named the core's notifications
    "hooks": ("framework", "0.4"),
}
_PACKAGE = __name__.rpartition(".")[0]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``asyncthrottle.<old>`` and hands out the module that now holds it, unchanged."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec:
        name = fullname.removeprefix(f"{_PACKAGE}.")
        if name == fullname or name not in MOVED:
            return None  # type: ignore[return-value]
        return importlib.machinery.ModuleSpec(fullname, self)

    def exec_module(self, module: ModuleType) -> None:
        """Put the new module in ``sys.modules`` in place of the placeholder the import system made
        for the old path, which the import then returns; the new module is left as it is (its
        ``__spec__`` stays its own: its relative imports and ``importlib.reload`` read it)."""
        old = module.__name__
        new, moved = MOVED[old.removeprefix(f"{_PACKAGE}.")]
        if moved is not None:
            major, minor = moved.split(".")
            warnings.warn(
                f"{old} moved to {_PACKAGE}.{new} in asyncthrottle {moved}; import it from there "
                f"(the old path goes away in {major}.{int(minor) + 1})",
                DeprecationWarning,
                stacklevel=_importer_level(),
            )
        sys.modules[old] = importlib.import_module(f"{_PACKAGE}.{new}")


def _importer_level() -> int:
    """``warn()``'s stacklevel for the line that imports the old path (called from
    ``exec_module``): the first frame outside the import system.

    ``warn()`` steps over importlib's bootstrap frames itself, as this counts them; it does not
    step over ``importlib.import_module``.
    """
    # warn() starts at exec_module (level 1)
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while True:
        while frame is not None and _bootstrap(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None or frame.f_code.co_filename != importlib.__file__:
            return level
        frame, level = frame.f_back, level + 1


def _bootstrap(filename: str) -> bool:
    # what warn() counts as the import system's own frames
    return "importlib" in filename and "_bootstrap" in filename


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import asyncthrottle`` does it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
