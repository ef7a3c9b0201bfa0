"""Validation of the Throttle's options: each error names the option, the value and the rule."""

from __future__ import annotations

import math

__all__ = ["check_depth", "check_sample_every", "check_timeout"]


def check_depth(depth: object) -> int | None:
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"depth must be an int >= 1 or None, got {depth!r} ({type(depth).__name__})")
    if depth < 1:
        raise ValueError(f"depth must be an int >= 1 or None, got {depth!r}; depth=1 syncs once per step")
    return depth


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    if not timeout > 0:  # also rejects NaN
        raise ValueError(f"timeout must be a number of seconds > 0 or None, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def check_sample_every(sample_every: object) -> int | None:
    if sample_every is None:
        return None
    if isinstance(sample_every, bool) or not isinstance(sample_every, int) or sample_every < 1:
        raise ValueError(f"sample_every must be an int >= 1 (time every k-th step) or None, got {sample_every!r}")
    return sample_every
