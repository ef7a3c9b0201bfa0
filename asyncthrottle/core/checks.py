"""Option checks, one rule for all: a wrong type raises ``TypeError``, a wrong value ``ValueError``.

Every message names the option, the value and a fix. Every check runs on every
backend, the CPU included, before anything is built: a value the CPU accepts
never fails only on a GPU. The core's wait strategies check their options
here; the throttle and the parts reach these through ``asyncthrottle._options``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

_NUMBER = (int, float)


def wrong_type(option: str, value: object, rule: str, fix: str) -> TypeError:
    return TypeError(f"{option} must be {rule}, got {value!r} ({type(value).__name__}); {fix}")


def check_bool(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise wrong_type(option, value, "True or False", f"pass {option}=True or {option}=False")
    return value


def check_int(option: str, value: object, *, minimum: int, rule: str, fix: str,
              none: bool = True) -> int | None:
    """An int >= ``minimum`` (None too when ``none``); ``rule`` says what the option means."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(option, value, rule, fix)
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
        raise wrong_type(option, value, rule, fix)
    # `not > 0` also rejects NaN
    if not value > 0 or (math.isinf(value) and infinite == "error"):
        raise ValueError(f"{option} must be {rule}, got {value!r}; {fix}")
    return None if math.isinf(value) else float(value)


def check_real(option: str, value: object, *, low: float, high: float = math.inf,
               low_open: bool = False, rule: str, fix: str) -> float:
    """A number in ``[low, high]`` (``(low, high]`` when ``low_open``); NaN and bools are refused
    (a NaN compares False everywhere: a wait bounded by one never ends)."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        raise wrong_type(option, value, rule, fix)
    if not (low < value if low_open else low <= value) or not value <= high:
        raise ValueError(f"{option} must be {rule}, got {value!r}; {fix}")
    return float(value)


def check_choice(option: str, value: object, choices: Iterable[str | None], *, fix: str) -> Any:
    """One of ``choices``; a string that differs only in case or spaces is told how to write it."""
    allowed = tuple(choices)
    if value in allowed and (value is None or isinstance(value, str)):
        return value
    shown = (", ".join(repr(c) for c in allowed[:-1]) + f" or {allowed[-1]!r}"
             if len(allowed) > 1 else repr(allowed[0]))
    if not isinstance(value, str):
        raise wrong_type(option, value, shown, fix)
    near = [c for c in allowed if isinstance(c, str) and c == value.strip().lower()]
    hint = f"write it {option}={near[0]!r}" if near else fix
    raise ValueError(f"{option} must be {shown}, got {value!r}; {hint}")


def check_callable(option: str, value: object, *, rule: str, fix: str) -> Any:
    if value is not None and not callable(value):
        raise wrong_type(option, value, rule, fix)
    return value
