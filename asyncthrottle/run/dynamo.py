"""Keeping Dynamo out of the runner: a compiled function that calls into a hook of the runner
(its ``loss.backward()``, a graph break that runs eagerly) must not compile the runner's code."""

from __future__ import annotations

import logging
import sys
from types import ModuleType

from ..audit.patches import Patches
from .imports import after_import

__all__ = ["keep_out"]

logger = logging.getLogger("asyncthrottle")

# traced inline into a compiled module or op: each of their functions first tests
# torch.compiler.is_compiling() and returns; skipped, Dynamo would break the graph at them
_INLINED = ("asyncthrottle.run.torchhooks", "asyncthrottle.audit.reads",
            "asyncthrottle.audit.homes")


def keep_out(patches: Patches) -> None:
    """Once the script imports Dynamo (``torch.compile`` does; never before), Dynamo runs the
    runner's hooks (``patches.codes``) as they are, never compiling them, and skips every module
    of this package they call (as it skips torch's own): under ``run`` a compiled function gets
    the graphs, breaks and recompiles it gets under ``python``. ``patches.undo()`` takes it
    back."""
    def imported(dynamo: ModuleType) -> None:
        try:
            _skip(patches)
        except Exception as exc:
            # another torch's Dynamo: the script's import goes on, the runner says why
            logger.warning("asyncthrottle run: could not keep torch.compile out of the runner's "
                           "hooks (%r): a compiled function that calls them may break its graph "
                           "there", exc)

    after_import({"torch._dynamo": imported}, patches)


def _skip(patches: Patches) -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.eval_frame import skip_code

    for code in patches.codes:
        skip_code(code)
    count = len(trace_rules.SKIP_DIRS)
    for name, module in sorted(sys.modules.items()):
        # a module's file, not a package's folder (it holds the inlined ones)
        if name.split(".")[0] == "asyncthrottle" and name not in _INLINED and not hasattr(
                module, "__path__"):
            trace_rules.add(name)
    added = trace_rules.SKIP_DIRS[count:]
    patches.call(lambda: _forget(trace_rules, added))


def _forget(trace_rules: ModuleType, added: list[str]) -> None:
    for path in added:
        if path in trace_rules.SKIP_DIRS:
            trace_rules.SKIP_DIRS.remove(path)
    # the skip rule's regex, made again from the list as trace_rules.add() makes it
    trace_rules._recompile_re()
