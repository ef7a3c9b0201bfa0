"""Option checks, one rule for all: a wrong type raises ``TypeError``, a wrong value ``ValueError``.

Every message names the option, the value and a fix. Every check runs on every
backend, the CPU included, before anything is built: a value the CPU accepts
never fails only on a GPU. Parts call these helpers from their own ``check``;
the helpers live in ``core/checks.py`` (the core's wait strategies use them,
and the core imports nothing outside ``core/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .core.checks import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_positive,
    check_real,
    wrong_type,
)

__all__ = [
    "check_bool", "check_callable", "check_choice", "check_core", "check_depth", "check_int",
    "check_positive", "check_real",
]


# -- the options of the core (the parts check their own) ----------------------


def check_depth(depth: object) -> int | str | None:
    """``depth``: an int >= 1, None (track only) or ``"auto"``."""
    if isinstance(depth, str):
        if depth == "auto":
            return depth
        if depth.strip().lower() == "auto":
            raise ValueError(f"depth={depth!r}: write it depth='auto' (lower case, no spaces)")
        raise ValueError(f"depth must be an int >= 1, 'auto' or None, got {depth!r} (str); e.g. "
                         "depth=2")
    checked = check_int("depth", depth, minimum=1, rule="an int >= 1, 'auto' or None",
                        fix="depth=1 syncs once per step, depth=2 is the usual choice")
    return checked


def check_core(options: Mapping[str, Any]) -> float | None:
    """The core's options: depth, timeout, drain and clock (wait, device, events: their resolvers).

    Returns the timeout in seconds (None: wait for ever).
    """
    check_depth(options["depth"])
    timeout = check_positive("timeout", options["timeout"], rule="a number of seconds > 0 or None",
                             fix="pass e.g. timeout=60.0, or None to wait for ever",
                             infinite="none")
    check_bool("drain", options["drain"])
    if not callable(options["clock"]):
        raise wrong_type("clock", options["clock"], "a zero-argument callable returning seconds",
                          "pass e.g. clock=time.perf_counter")
    return timeout
