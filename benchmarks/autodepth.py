"""``depth="auto"`` against fixed depths, on loops whose host work varies: the hiccup loop and two
steady ones.

Run it from the source tree as ``python benchmarks/autodepth.py`` (it was ``bench --autodepth``:
a study of the controller on a simulated device, whose figures do not depend on the machine, so it
is not in the wheel). Each loop runs on the real-time simulated device
(:class:`~asyncthrottle.procdevice.ProcessDevice`, GIL-free): per step the host works (sleeps) for
the loop's host time, then launches 10 ms of device work. The same loops drive the deterministic
fake-device tests (``tests/parts/test_autodepth.py``, ``tests/parts/test_memory.py``).

* ``hiccup``: 2 ms of host work per step, 25 ms every 5th step (logging, a slow
  batch, a checkpoint): depth 1 -> 60, 2 -> 77, 3 -> 91, 4+ -> 100 steps/s;
* ``device-bound``: 2 ms of host work per step;
* ``host-bound``: 20 ms of host work per step.

Every mode is run ``--repeat`` times; the table gives the median with the
spread (min-max) of steps/s and of the most steps in flight.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncthrottle import Throttle
from asyncthrottle.testing.procdevice import ProcessDevice

__all__ = ["DEVICE_S", "LOOPS", "drive", "host_seconds", "main", "measure"]

# device seconds per step in every loop
DEVICE_S = 0.010
LOOPS = ("hiccup", "device-bound", "host-bound")
_MODES: tuple[int | str, ...] = (1, 2, 3, 4, 6, "auto")


def host_seconds(loop: str, step: int) -> float:
    """Host seconds the loop body spends in ``step`` before launching its device work."""
    if loop == "hiccup":
        return 0.025 if step % 5 == 4 else 0.002
    if loop == "device-bound":
        return 0.002
    if loop == "host-bound":
        return 0.020
    raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")


def drive(thr: Throttle, loop: str, steps: int, *, host: Callable[[float], None],
          launch: Callable[[float], Any]) -> None:
    """One pass of ``loop`` under ``thr``: each step the host works, then launches ``DEVICE_S`` of
    device work."""
    for step in thr.wrap(range(steps)):
        host(host_seconds(loop, step))
        launch(DEVICE_S)


def measure(loop: str, mode: int | str, steps: int) -> dict[str, Any]:
    """Run ``loop`` once on a fresh simulated device under ``mode`` (a depth or ``"auto"``)."""
    with ProcessDevice() as device:
        thr = Throttle(mode, events=device.event, sample_every=None)
        drive(thr, loop, steps, host=time.sleep, launch=device.launch)
        stats = thr.stats
    return {
        "loop": loop,
        "mode": str(mode),
        "steps_per_s": stats.steps_per_s,
        "max_in_flight": stats.max_in_flight,
        "final_depth": stats.depth,
        "depth_changes": [list(change) for change in stats.depth_changes],
        "dry_fraction": stats.dry_fraction,
        "verdict": stats.verdict,
    }


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["steps_per_s"] for r in runs]
    most = [r["max_in_flight"] for r in runs]
    depths = sorted({r["final_depth"] for r in runs})
    verdicts = sorted({r["verdict"] for r in runs})
    return {
        "loop": runs[0]["loop"],
        "mode": runs[0]["mode"],
        "runs": len(runs),
        "steps_per_s_median": statistics.median(rates),
        "steps_per_s_min": min(rates),
        "steps_per_s_max": max(rates),
        "max_in_flight_median": statistics.median(most),
        "max_in_flight_min": min(most),
        "max_in_flight_max": max(most),
        "final_depths": depths,
        "verdicts": verdicts,
        "changes_first_run": runs[0]["depth_changes"],
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'loop':<13} {'mode':<6} {'steps/s median (min-max)':>25} {'max in flight':>14} "
            f"{'depth at end':>12}")
    lines = [head + "  verdict"]
    for row in rows:
        rate = (f"{row['steps_per_s_median']:.1f} ({row['steps_per_s_min']:.1f}-"
                f"{row['steps_per_s_max']:.1f})")
        most = (f"{row['max_in_flight_median']:g} ({row['max_in_flight_min']}-"
                f"{row['max_in_flight_max']})")
        depths = "/".join(str(d) for d in row["final_depths"])
        lines.append(
            f"{row['loop']:<13} {row['mode']:<6} {rate:>25} {most:>14} {depths:>12}  "
            f"{'/'.join(row['verdicts'])}"
        )
    return "\n".join(lines)


def _mode(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"modes are depths >= 1 or 'auto', got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each loop under each mode and print a table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python benchmarks/autodepth.py",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", default=",".join(LOOPS),
                        help=f"comma-separated subset of {','.join(LOOPS)}")
    parser.add_argument("--modes", type=lambda t: [_mode(p) for p in t.split(",")],
                        default=list(_MODES), help="depths and/or auto (default 1,2,3,4,6,auto)")
    parser.add_argument("--steps", type=int, default=200, help="steps per run (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per mode (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    loops = [part.strip() for part in args.loops.split(",") if part.strip()]
    if not loops or any(loop not in LOOPS for loop in loops):
        parser.error(f"--loops must be a comma-separated subset of {','.join(LOOPS)}, got "
                     f"{args.loops!r}")
    if args.steps < 10 or args.repeat < 1:
        parser.error(f"--steps must be >= 10 and --repeat >= 1, got {args.steps} and {args.repeat}")
    rows = []
    for loop in loops:
        for mode in args.modes:
            rows.append(_summarise([measure(loop, mode, args.steps) for _ in range(args.repeat)]))
    if args.json:
        print(json.dumps({"steps": args.steps, "repeat": args.repeat, "device_s": DEVICE_S,
                          "rows": rows}, indent=2))
        return 0
    print(f"depth='auto' vs fixed depths on the real-time simulated device: {DEVICE_S * 1e3:g} ms "
          f"of device work per step, {args.steps} steps, median of {args.repeat} runs (min-max)")
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
