"""The user's line: where the library's warnings point, outside it and the frameworks calling it."""

from __future__ import annotations

import sys
import warnings
from types import FrameType

# top-level packages whose frames are never the user's code: this library, the frameworks whose
# callbacks it is, and torch (a warning raised under a framework names the user's fit()/train())
_NOT_USERS = frozenset({
    "accelerate", "asyncthrottle", "lightning", "lightning_fabric", "pytorch_lightning", "torch",
    "transformers",
})


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame from ``frame`` outwards that is the user's, or None."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not isinstance(module, str) or module.partition(".")[0] not in _NOT_USERS:
            return frame
        frame = frame.f_back
    return None


def warn_at_user(message: str, category: type[Warning]) -> None:
    """Warn at the user's line, every time it is called: the caller decides how often (once a
    throttle, once a callback).

    Python's once-per-line filter would otherwise show it for the first throttle of a process
    only (a sweep, a notebook cell run again); Python 3.11 has no ``skip_file_prefixes``.
    """
    frame = user_frame(sys._getframe(1))
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    where = (message, category, frame.f_code.co_filename, frame.f_lineno)
    module = frame.f_globals.get("__name__")
    try:
        # a fresh registry: shown whatever this line warned before
        warnings.warn_explicit(*where, module=module, registry={}, module_globals=frame.f_globals)
        return
    except ImportError:
        # asking the loader for the line's source failed before anything was shown: ``__main__``
        # of ``python -c`` or the REPL (its loader, BuiltinImporter, has no source)
        pass
    # outside the except block: a warning turned error does not chain the ImportError
    warnings.warn_explicit(*where, module=module, registry={})
