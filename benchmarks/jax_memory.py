"""The memory that JAX run-ahead holds, and that the throttle releases: one fresh process per mode.

Run it from the source tree as ``python benchmarks/jax_memory.py [--steps N] [--mib M] [--modes
...] [--repeat R] [--json]`` (it was ``python -m asyncthrottle.bench.jax_memory``: a study on a
synthetic loop, so it is not in the wheel).
Each step loads a fresh ``M`` MiB batch on the host, puts it on the device
and runs a program that returns an ``M`` MiB output. Unthrottled, the host
queues up to XLA's 32 programs, each holding its batch; with a throttle at
most ``depth`` are queued. Each mode runs in its own subprocess, so its peak
resident memory (``ru_maxrss``) is its own. Modes ``8+mem`` and ``auto+mem``
add ``max_memory`` = the resident memory before the loop + ``--budget-mib``,
read by :func:`asyncthrottle.memory.rss_bytes` (JAX's CPU backend has no
``memory_stats()``); ``auto`` is ``depth="auto"``. With ``--repeat R`` each mode
runs R times and the table gives medians with the spread (min-max).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["main", "measure_mode"]

MODES = ("unthrottled", "1", "2", "4")
# depth 8; depth="auto"; max_memory at depth 8 or auto
EXTRA_MODES = ("8", "auto", "8+mem", "auto+mem")


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    # not Linux: peak only
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_mode(mode: str, steps: int, mib: int, budget_mib: int = 256) -> dict[str, Any]:
    """Run the loop in this process under ``mode`` and measure it.

    ``mode`` is "unthrottled", a depth, "auto", or "8+mem"/"auto+mem" (a
    ``max_memory`` budget of ``budget_mib`` MiB above the resident memory
    before the loop).
    """
    import numpy as np

    from asyncthrottle import MemoryBudget, Throttle
    from asyncthrottle.backends.jax import _jax
    from asyncthrottle.backends.memory import rss_bytes

    jax = _jax()
    size = mib * 1024 * 1024 // 4
    step = jax.jit(lambda w,
                   batch: (w + 1e-6 * batch[0], jax.numpy.sin(jax.numpy.tanh(batch * w + 1.0))))
    w, _ = step(np.float32(0.5), np.ones(size, np.float32))
    # compile and warm up before measuring
    jax.block_until_ready(w)
    before = _rss_mib("VmRSS")
    depth, _, budget = mode.partition("+")
    options: dict[str, Any] = {}
    if budget:
        options = {"max_memory": MemoryBudget(int((before + budget_mib) * 2**20), probe=rss_bytes)}
    thr = (None if mode == "unthrottled"
           else Throttle(depth if depth == "auto" else int(depth), device="jax", **options))
    loop = range(steps) if thr is None else thr.wrap(range(steps))
    markers: list[Any] = []
    most = 0
    start = time.perf_counter()
    for i in loop:
        # queries only
        most = max(most, sum(1 for m in markers if not m.is_ready()))
        # a fresh batch from the "loader"
        batch = jax.device_put(np.full(size, i % 7, np.float32))
        # the output lives until the next step's replaces it
        w, _output = step(w, batch)
        markers.append(w)
    jax.block_until_ready(w)  # host-device sync: the end of the measured loop
    seconds = time.perf_counter() - start
    peak = _rss_mib("VmHWM")
    row = {
        "mode": mode,
        "steps_per_s": steps / seconds,
        "peak_rss_mib": peak,
        "growth_mib": peak - before,
        "max_in_flight": most,
    }
    if thr is not None:
        stats = thr.stats
        row["final_depth"] = stats.depth
        if budget:
            row["budget_mib"] = budget_mib
            row["probe_peak_growth_mib"] = (stats.memory_peak or 0) / 2**20 - before
            row["memory_waits"] = stats.memory_waits
            # all with nothing in flight
            row["over_budget_handouts"] = stats.memory_over
    return row


def _run_child(mode: str, steps: int, mib: int, budget_mib: int = 256) -> dict[str, Any]:
    child = [
        "--child", mode, "--steps", str(steps), "--mib", str(mib), "--budget-mib", str(budget_mib),
    ]
    argv = [sys.executable, str(Path(__file__).resolve()), *child]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the {mode!r} run failed (exit "
                           f"{result.returncode}):\n{result.stderr[-2000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    """Measure every mode in a fresh subprocess and print a table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python benchmarks/jax_memory.py",
                                     description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="steps per mode (default 60)")
    parser.add_argument("--mib", type=int, default=16,
                        help="MiB per batch and per output (default 16)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, from {','.join(MODES + EXTRA_MODES)} (default "
                             f"{','.join(MODES)})")
    parser.add_argument("--budget-mib", type=int, default=256,
                        help="max_memory above the loop's start, MiB (256)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="fresh processes per mode; medians (min-max) if > 1")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--child", choices=MODES + EXTRA_MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.mib < 1 or args.budget_mib < 1 or args.repeat < 1:
        parser.error(f"--steps, --mib, --budget-mib and --repeat must be >= 1, got {args.steps}, "
                     f"{args.mib}, {args.budget_mib} and {args.repeat}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES + EXTRA_MODES for m in modes):
        parser.error(f"--modes must be a comma-separated subset of "
                     f"{','.join(MODES + EXTRA_MODES)}, got {args.modes!r}")
    if args.child:
        print(json.dumps(measure_mode(args.child, args.steps, args.mib, args.budget_mib)))
        return 0
    if args.repeat > 1:
        return _repeated(modes, args)
    rows = [_run_child(mode, args.steps, args.mib, args.budget_mib) for mode in modes]
    if args.json:
        print(json.dumps({"machine": platform.platform(), "steps": args.steps, "mib": args.mib,
                          "rows": rows}))
        return 0
    print(f"JAX {args.mib} MiB batch + {args.mib} MiB output per step, {args.steps} steps, one "
          "process per mode")
    print(f"{'mode':<12} {'steps/s':>8} {'peak RSS MiB':>13} {'growth MiB':>11} "
          f"{'max in flight':>14}")
    for row in rows:
        label = row["mode"] if not row["mode"].isdigit() else f"depth {row['mode']}"
        print(
            f"{label:<12} {row['steps_per_s']:>8.1f} {row['peak_rss_mib']:>13.0f} "
            f"{row['growth_mib']:>11.0f} {row['max_in_flight']:>14d}"
        )
    return 0


def _repeated(modes: list[str], args: argparse.Namespace) -> int:
    """Each mode ``--repeat`` times in fresh processes (interleaved): medians with min-max."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(args.repeat):
        for mode in modes:
            runs[mode].append(_run_child(mode, args.steps, args.mib, args.budget_mib))
    if args.json:
        doc = {
            "machine": platform.platform(), "steps": args.steps, "mib": args.mib,
            "budget_mib": args.budget_mib, "runs": runs,
        }
        print(json.dumps(doc))
        return 0
    print(f"JAX {args.mib} MiB batch + {args.mib} MiB output per step, {args.steps} steps, one "
          f"process per run, median (min-max) of {args.repeat}; budgets: RSS before the loop + "
          f"{args.budget_mib} MiB")
    print(f"{'mode':<12} {'steps/s':>20} {'growth MiB':>18} {'probe peak MiB':>15} "
          f"{'max in flight':>14} {'depth':>6} {'over budget':>12}")
    for mode, rows in runs.items():
        def cell(key: str, fmt: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [r[key] for r in rows if key in r]
            if not values:
                return "-"
            return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

        label = mode if mode in ("unthrottled", "auto", "8+mem", "auto+mem") else f"depth {mode}"
        depths = sorted({str(r.get("final_depth", "-")) for r in rows})
        print(f"{label:<12} {cell('steps_per_s', '.1f'):>20} {cell('growth_mib', '.0f'):>18} "
              f"{cell('probe_peak_growth_mib', '.0f'):>15} {cell('max_in_flight', '.0f'):>14} "
              f"{'/'.join(depths):>6} {cell('over_budget_handouts', '.0f'):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
