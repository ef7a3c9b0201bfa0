"""Module paths that moved in 0.3: each old path imports its new module (most with a
``DeprecationWarning``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import FrameType, ModuleType

# Old path (under asyncthrottle) -> (new path, deprecated). The paths that are not deprecated are
# public
# homes kept on purpose: the test devices and the probes users pass as ``memory=``.
MOVED = {
    "simulated": ("testing.simulated", False),
    "procdevice": ("testing.procdevice", False),
    "memory": ("backends.memory", False),
    "syncaudit": ("parts.syncaudit", False),
    "completions": ("values", True),
    "deferred": ("values", True),
    "passes": ("view", True),
    "options": ("_options", True),
    "events": ("core.events", True),
    "waits": ("core.waits", True),
    "errors": ("core.errors", True),
    "ownership": ("core.ownership", True),
    "hosttime": ("core.hosttime", True),
    "telemetry": ("parts.timing", True),
    "controller": ("parts.autodepth", True),
    "prefetch": ("parts.prefetch", True),
    "stall": ("parts.stall", True),
    "ranks": ("parts.ranks", True),
    "trace": ("parts.trace", True),
    "profiling": ("parts.profiling", True),
    "progress": ("parts.progress", True),
    "syncdebug": ("parts.syncdetect", True),
    "devices": ("backends.torch", True),
    "pool": ("backends.pool", True),
    "copies": ("backends.copies", True),
    "pinned": ("backends.pinned", True),
    "bench.seed": ("bench.experiments", True),
    "bench.seed_values": ("bench.add_one_deferred", True),
    "bench.model": ("bench.cost_model", True),
    "bench.backend": ("bench.backends", True),
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
        new, deprecated = MOVED[old.removeprefix(f"{_PACKAGE}.")]
        if deprecated:
            warnings.warn(
                f"{old} moved to {_PACKAGE}.{new} in asyncthrottle 0.3; import it from there (the "
                "old path goes away in 0.4)",
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
