"""The per-step Python calls and bytecodes of ``bench --overhead``'s loops: the hot path's cost
as counts, the same on every run, where a 2-core VM's timings cannot tell 5 % apart.

Run: ``.venv/bin/python benchmarks/step_counts.py [--steps 400]`` (``PYTHONPATH=TREE`` counts
another tree of the package, e.g. one exported with ``git archive REV``).

Each loop runs once warm, then under ``sys.settrace`` with opcode events: Python frames entered
(``call``) and bytecodes executed, over ``2 * steps`` items less over ``steps`` items, per step (a
pass's start and end cancel out: the figures are exact). The rows: the throttle on each of
``bench --overhead``'s backends (depth 2), the hand-written reference loop and the 10-line
generator on the same no-op events. Bytecodes depend on the Python version (3.11 here); the calls
do not.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from asyncthrottle.bench.overhead import _OVERHEAD_CASES, _NoopEvent, _throttled
from asyncthrottle.bench.reference import Reference, generator_throttle


def _traced(loop: Iterable[Any]) -> tuple[int, int]:
    seen = {"call": 0, "opcode": 0}

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
        if event in seen:
            seen[event] += 1
        return trace

    sys.settrace(trace)
    try:
        for _ in loop:
            pass
    finally:
        sys.settrace(None)
    return seen["call"], seen["opcode"]


def counts(make: Callable[[list[int]], Iterable[Any]], steps: int) -> tuple[float, float]:
    """(Python calls, bytecodes) a step of a loop ``make(items)``: over ``2 * steps`` items less
    over ``steps``."""
    short, long = list(range(steps)), list(range(2 * steps))
    for _ in make(long):
        pass
    calls_short, ops_short = _traced(make(short))
    calls_long, ops_long = _traced(make(long))
    return (calls_long - calls_short) / steps, (ops_long - ops_short) / steps


def _on(case: Callable[[], dict[str, Any]], data: list[int]) -> Iterable[Any]:
    return _throttled(data, case())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    loops: dict[str, Callable[[list[int]], Iterable[Any]]] = {
        name: partial(_on, case) for name, case in _OVERHEAD_CASES.items()
    }
    loops["reference"] = lambda data: Reference(data, _NoopEvent, 2)
    loops["generator"] = lambda data: generator_throttle(data, _NoopEvent, 2)
    print(f"per step, {args.steps} steps, Python {sys.version.split()[0]}:")
    for name, make in loops.items():
        calls, ops = counts(make, args.steps)
        print(f"  {name:26s} {calls:6.2f} calls {ops:8.2f} bytecodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
