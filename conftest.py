"""The doctests of the package's modules: a module whose optional framework is not installed is not
collected (importing it raises ModuleNotFoundError with its install hint, by design)."""

from __future__ import annotations

import importlib.util

_NEEDS = {
    "asyncthrottle/lightning.py": "lightning",
    "asyncthrottle/transformers.py": "transformers",
}

collect_ignore = [path for path, module in _NEEDS.items()
                  if importlib.util.find_spec(module) is None]
