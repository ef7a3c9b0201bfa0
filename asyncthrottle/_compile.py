"""What a ``torch.compile``'d step may call runs eagerly there, as a graph break.

``defer()``, ``latest``, ``in_flight`` and ``stats`` read the throttle's step counters: traced
by Dynamo, they would be guards, and the user's step would compile again every step. The
first throttle made once torch is imported calls :func:`see_torch`; torch is never imported here,
nor Dynamo (``torch.compiler.disable`` imports it: seconds, sympy included, that a loop which
never compiles must not pay), which a compile imports: :func:`see_dynamo` looks for it where no
compile traces (a throttle's start, a pass's, a loop's first ``begin_step()``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def _never() -> bool:
    return False


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


# torch.compiler.is_compiling, once torch is seen
compiling: Callable[[], bool] = _never
# _call under torch.compiler.disable, once torch is seen
eagerly: Callable[..., Any] = _call


def seen() -> bool:
    return compiling is not _never


def see_torch() -> None:
    """Once torch is imported: :data:`compiling` is torch.compiler's, and :data:`eagerly` too
    once Dynamo is (see :func:`see_dynamo`).

    Outside a compile a guarded call then costs one ``torch.compiler.is_compiling()`` (0.1 us).
    """
    global compiling
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    if (compiler is None or not hasattr(compiler, "disable")
            or not hasattr(compiler, "is_compiling")):
        # no torch (yet), or one without torch.compiler: nothing compiles these calls
        return
    compiling = compiler.is_compiling
    see_dynamo()


def see_dynamo() -> None:
    """Where no compile traces: :data:`eagerly` is ``torch.compiler.disable``'s once torch.compile
    has imported Dynamo (a ``torch.compile()`` call does, before it traces anything)."""
    global eagerly
    if eagerly is _call and compiling is not _never and "torch._dynamo" in sys.modules:
        eagerly = sys.modules["torch"].compiler.disable(_call)
