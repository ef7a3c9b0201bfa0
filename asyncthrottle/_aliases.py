"""Module paths that moved in 0.3: each old path imports its new module (most with a
``DeprecationWarning``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

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
}
_PACKAGE = __name__.rpartition(".")[0]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``asyncthrottle.<old>`` and hands out the module that now holds it."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec:
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE or name not in MOVED:
            return None  # type: ignore[return-value]
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new, deprecated = MOVED[spec.name.rpartition(".")[2]]
        if deprecated:
            warnings.warn(
                f"{spec.name} moved to {_PACKAGE}.{new} in asyncthrottle 0.3; import it from there "
                "(the old path goes away in 0.4)",
                DeprecationWarning,
                stacklevel=4,
            )
        return importlib.import_module(f"{_PACKAGE}.{new}")

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import asyncthrottle`` does it)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
