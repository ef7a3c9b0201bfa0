"""What the sync-sites audit of ``python -m asyncthrottle run`` costs (#39): ops that are not reads,
the patched methods' non-read calls (indexing by an int, ``.to(dtype)``) and each counted read, on
the CPU, with and without ``SyncSites.start()``; interleaved rounds, the median and the spread.

    python benchmarks/syncsites_cost.py [--calls 20000] [--rounds 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from asyncthrottle.audit.patches import Patches
from asyncthrottle.audit.syncsites import SyncSites


def loops() -> dict[str, tuple[Callable[[int], None], bool]]:
    """Each loop of ``n`` calls, and whether its calls are reads (counted by the audit)."""
    x = torch.ones(8)
    mask = x > 0.5

    def ops(n: int) -> None:  # none of these is patched
        for _ in range(n):
            torch.relu((x + 1) * 2).sum()

    def index(n: int) -> None:  # Tensor.__getitem__ patched: one type test
        for _ in range(n):
            x[0]
            x[1:3]

    def to_dtype(n: int) -> None:  # Tensor.to patched: a host copy only from a device tensor
        for _ in range(n):
            x.to(torch.float64)

    def item(n: int) -> None:
        for _ in range(n):
            x[0].item()

    def masked(n: int) -> None:
        for _ in range(n):
            x[mask]

    return {"ops": (ops, False), "x[int], x[slice]": (index, False), "to(dtype)": (to_dtype, False),
            "x[0].item()": (item, True), "x[mask]": (masked, True)}


def _time(loop: Callable[[int], None], calls: int, audit: bool, reads: bool) -> float:
    """Seconds per call of one timed run (the audit started just before, stopped after)."""
    sites = SyncSites([str(Path(__file__).parent)])
    patches = Patches()
    if audit:
        sites.start(patches)
    try:
        start = time.perf_counter()
        loop(calls)
        seconds = (time.perf_counter() - start) / calls
    finally:
        sites.stop()
        patches.undo()
    counted = sum(row["count"] for row in sites.rows(1))
    if audit and counted != (calls if reads else 0):  # the audit saw what it should, no more
        raise SystemExit(f"the audit counted {counted} reads, expected {calls if reads else 0}")
    return seconds


def _python_calls(loop: Callable[[int], None], audit: bool) -> float:
    """Python function calls per loop iteration (``sys.setprofile``: the deterministic figure)."""
    sites = SyncSites([str(Path(__file__).parent)])
    seen = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[0] += 1

    patches = Patches()
    if audit:
        sites.start(patches)
    try:
        loop(1)  # the audit learns each file's kind once
        sys.setprofile(profile)
        loop(100)
    finally:
        sys.setprofile(None)
        sites.stop()
        patches.undo()
    return (seen[0] - 1) / 100  # the loop's own frame aside


def measure(calls: int, rounds: int) -> list[dict[str, Any]]:
    """Per loop: the median off/on time per call over interleaved rounds, and the cost's spread."""
    rows = []
    for name, (loop, reads) in loops().items():
        loop(calls // 10)  # warm
        off: list[float] = []
        on: list[float] = []
        for i in range(rounds):  # interleaved, alternating which goes first
            for audit in ((False, True) if i % 2 == 0 else (True, False)):
                (on if audit else off).append(_time(loop, calls, audit, reads))
        costs = sorted(b - a for a, b in zip(off, on, strict=True))
        rows.append({
            "loop": name, "reads": reads, "off_us": statistics.median(off) * 1e6,
            "on_us": statistics.median(on) * 1e6,
            "cost_us": statistics.median(costs) * 1e6,
            "cost_spread_us": [costs[0] * 1e6, costs[-1] * 1e6],
            "python_calls": [_python_calls(loop, False), _python_calls(loop, True)],
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.calls < 10 or args.rounds < 1:
        p.error("--calls must be >= 10 and --rounds >= 1")
    torch.set_num_threads(1)
    rows = measure(args.calls, args.rounds)
    if args.json:
        print(json.dumps({"calls": args.calls, "rounds": args.rounds, "rows": rows}))
        return 0
    print(f"torch {torch.__version__}, CPU, {args.calls} calls x {args.rounds} interleaved rounds "
          "(median; the cost's spread is min..max of the rounds' on-off differences)")
    for row in rows:
        low, high = row["cost_spread_us"]
        print(f"  {row['loop']:<18} off {row['off_us']:7.3f} us  on {row['on_us']:7.3f} us  "
              f"cost {row['cost_us']:+7.3f} us per call ({low:+.3f} .. {high:+.3f})  "
              f"Python calls {row['python_calls'][0]:g} -> {row['python_calls'][1]:g}"
              f"{'  [a counted read]' if row['reads'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
