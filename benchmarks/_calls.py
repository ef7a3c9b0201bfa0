"""Exact call counts of a loop, for the benchmark scripts: Python and C calls per step."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any


def calls_per_step(loop: Callable[[int], None], steps: int = 200) -> tuple[float, float]:
    """(Python calls, C calls) per step, over ``steps`` steps of a warm loop."""
    counts: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            counts[event] += 1

    loop(steps)
    sys.setprofile(profile)
    try:
        loop(steps)
    finally:
        sys.setprofile(None)
    return counts["call"] / steps, counts["c_call"] / steps
