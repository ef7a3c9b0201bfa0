"""Validation of the Throttle's options: each error names the option, the value and the rule."""

from __future__ import annotations

import math

__all__ = ["DEFAULT_MAX_DEPTH", "check_auto", "check_depth", "check_sample_every", "check_timeout"]

DEFAULT_MAX_DEPTH = 8  # depth="auto" never goes deeper unless told


def check_depth(depth: object) -> int | None:
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"depth must be an int >= 1, 'auto' or None, got {depth!r} ({type(depth).__name__})")
    if depth < 1:
        raise ValueError(f"depth must be an int >= 1, 'auto' or None, got {depth!r}; depth=1 syncs once per step")
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


def check_auto(depth: object, max_depth: object) -> int | None:
    """``depth="auto"``: its ``max_depth`` (default 8); a fixed depth: None, and ``max_depth`` must be absent."""
    if isinstance(depth, str):
        if depth.strip().lower() == "auto" and depth != "auto":
            raise ValueError(f"depth={depth!r}: write it depth='auto' (lower case, no spaces)")
        if depth != "auto":
            raise TypeError(f"depth must be an int >= 1, None or 'auto', got {depth!r} (str)")
        if max_depth is None:
            return DEFAULT_MAX_DEPTH
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1 (the deepest depth='auto' may go), got {max_depth!r}")
        return max_depth
    if max_depth is not None:
        raise ValueError(
            f"max_depth={max_depth!r} applies to depth='auto' only, but depth={depth!r}; "
            "drop max_depth, or pass depth='auto'"
        )
    return None
