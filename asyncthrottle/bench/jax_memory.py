"""The memory that JAX run-ahead holds, and that the throttle releases: one fresh process per mode.

Run it as ``python -m asyncthrottle.bench.jax_memory [--steps N] [--mib M] [--json]``.
Each step loads a fresh ``M`` MiB batch on the host, puts it on the device
and runs a program that returns an ``M`` MiB output. Unthrottled, the host
queues up to XLA's 32 programs, each holding its batch; with a throttle at
most ``depth`` are queued. Each mode runs in its own subprocess, so its peak
resident memory (``ru_maxrss``) is its own.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from typing import Any

__all__ = ["main", "measure_mode"]

MODES = ("unthrottled", "1", "2", "4")


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: peak only


def measure_mode(mode: str, steps: int, mib: int) -> dict[str, Any]:
    """Run the loop in this process under ``mode`` ("unthrottled" or a depth) and measure it."""
    import numpy as np

    from ..jax import _jax
    from ..throttle import Throttle

    jax = _jax()
    size = mib * 1024 * 1024 // 4
    step = jax.jit(lambda w, batch: (w + 1e-6 * batch[0], jax.numpy.sin(jax.numpy.tanh(batch * w + 1.0))))
    w, _ = step(np.float32(0.5), np.ones(size, np.float32))
    jax.block_until_ready(w)  # compile and warm up before measuring
    thr = None if mode == "unthrottled" else Throttle(int(mode), device="jax")
    loop = range(steps) if thr is None else thr.wrap(range(steps))
    before = _rss_mib("VmRSS")
    markers: list[Any] = []
    most = 0
    start = time.perf_counter()
    for i in loop:
        most = max(most, sum(1 for m in markers if not m.is_ready()))  # queries only
        batch = jax.device_put(np.full(size, i % 7, np.float32))  # a fresh batch from the "loader"
        w, _output = step(w, batch)  # the output lives until the next step's replaces it
        markers.append(w)
    jax.block_until_ready(w)  # host-device sync: the end of the measured loop
    seconds = time.perf_counter() - start
    peak = _rss_mib("VmHWM")
    return {
        "mode": mode,
        "steps_per_s": steps / seconds,
        "peak_rss_mib": peak,
        "growth_mib": peak - before,
        "max_in_flight": most,
    }


def _run_child(mode: str, steps: int, mib: int) -> dict[str, Any]:
    child = ["--child", mode, "--steps", str(steps), "--mib", str(mib)]
    argv = [sys.executable, "-m", "asyncthrottle.bench.jax_memory", *child]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the {mode!r} run failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    """Measure every mode in a fresh subprocess and print a table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m asyncthrottle.bench.jax_memory", description=__doc__)
    parser.add_argument("--steps", type=int, default=60, help="steps per mode (default 60)")
    parser.add_argument("--mib", type=int, default=16, help="MiB per batch and per output (default 16)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.mib < 1:
        parser.error(f"--steps and --mib must be >= 1, got {args.steps} and {args.mib}")
    if args.child:
        print(json.dumps(measure_mode(args.child, args.steps, args.mib)))
        return 0
    rows = [_run_child(mode, args.steps, args.mib) for mode in MODES]
    if args.json:
        print(json.dumps({"machine": platform.platform(), "steps": args.steps, "mib": args.mib, "rows": rows}))
        return 0
    print(f"JAX {args.mib} MiB batch + {args.mib} MiB output per step, {args.steps} steps, one process per mode")
    print(f"{'mode':<12} {'steps/s':>8} {'peak RSS MiB':>13} {'growth MiB':>11} {'max in flight':>14}")
    for row in rows:
        label = row["mode"] if row["mode"] == "unthrottled" else f"depth {row['mode']}"
        print(
            f"{label:<12} {row['steps_per_s']:>8.1f} {row['peak_rss_mib']:>13.0f} {row['growth_mib']:>11.0f}"
            f" {row['max_in_flight']:>14d}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
