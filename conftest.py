"""The whole session's settings: one OpenMP thread a torch process, and the doctests of the
package's modules (a module whose optional framework is not installed is not collected: importing
it raises ModuleNotFoundError with its install hint, by design)."""

from __future__ import annotations

import importlib.util
import os

# One OpenMP thread a process that imports torch: pytest-xdist runs a worker a core, and without
# this each worker, and each process a test starts, would run a torch thread a core, so the cores
# are oversubscribed and OpenMP's waiting threads spin on them (CPU time that does no work: about
# 15% of the suite's outside tests/run, whose scripts already run with one). Set before any module
# imports torch, and inherited by the workers and every process the tests start; a value already
# set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_NEEDS = {
    "asyncthrottle/lightning.py": "lightning",
    "asyncthrottle/transformers.py": "transformers",
}

collect_ignore = [path for path, module in _NEEDS.items()
                  if importlib.util.find_spec(module) is None]
