"""Option checks, one rule for all: a wrong type raises ``TypeError``, a wrong value ``ValueError``.

Every message names the option, the value and a fix. Every check runs on every
backend, the CPU included, before anything is built: a value the CPU accepts
never fails only on a GPU. Parts call these helpers from their own ``check``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

_NUMBER = (int, float)


def _wrong_type(option: str, value: object, rule: str, fix: str) -> TypeError:
    return TypeError(f"{option} must be {rule}, got {value!r} ({type(value).__name__}); {fix}")


def check_bool(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type(option, value, "True or False", f"pass {option}=True or {option}=False")
    return value


def check_int(option: str, value: object, *, minimum: int, rule: str, fix: str,
              none: bool = True) -> int | None:
    """An int >= ``minimum`` (None too when ``none``); ``rule`` says what the option means."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(option, value, rule, fix)
    if value < minimum:
        raise ValueError(f"{option} must be {rule}, got {value!r}; {fix}")
    return value


def check_positive(option: str, value: object, *, rule: str, fix: str,
                   infinite: str = "error") -> float | None:
    """A number > 0 or None; ``infinite``: ``"error"`` rejects ``inf``, ``"none"`` reads it as
    None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        raise _wrong_type(option, value, rule, fix)
    # `not > 0` also rejects NaN
    if not value > 0 or (math.isinf(value) and infinite == "error"):
        raise ValueError(f"{option} must be {rule}, got {value!r}; {fix}")
    return None if math.isinf(value) else float(value)


def check_choice(option: str, value: object, choices: Iterable[str | None], *, fix: str) -> Any:
    """One of ``choices``; a string that differs only in case or spaces is told how to write it."""
    allowed = tuple(choices)
    if value in allowed and (value is None or isinstance(value, str)):
        return value
    shown = (", ".join(repr(c) for c in allowed[:-1]) + f" or {allowed[-1]!r}"
             if len(allowed) > 1 else repr(allowed[0]))
    if not isinstance(value, str):
        raise _wrong_type(option, value, shown, fix)
    near = [c for c in allowed if isinstance(c, str) and c == value.strip().lower()]
    hint = f"write it {option}={near[0]!r}" if near else fix
    raise ValueError(f"{option} must be {shown}, got {value!r}; {hint}")


def check_callable(option: str, value: object, *, rule: str, fix: str) -> Any:
    if value is not None and not callable(value):
        raise _wrong_type(option, value, rule, fix)
    return value


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
        raise _wrong_type("clock", options["clock"], "a zero-argument callable returning seconds",
                          "pass e.g. clock=time.perf_counter")
    return timeout
