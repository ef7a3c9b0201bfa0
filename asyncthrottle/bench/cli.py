"""``python -m asyncthrottle bench``: the three experiments side by side, on one backend."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from .._typed import command, examples
from .backends import BACKENDS, SimCost, pick_backend
from .experiments import EXPERIMENTS, run_experiment
from .report import machine, plot_timelines, to_json, to_text

__all__ = ["main"]

def _epilog() -> str:
    return examples(
        ("bench", "all three experiments, best backend here"),
        ("bench --backend simulated --json", ""),
        ("bench --plot inflight.png", "needs pip install 'asyncthrottle[plot]'"),
        ("bench --sim-cost add=5:50 --experiments add", ""),
        ("bench --overhead", "the core's per-step overhead instead"),
        ("bench --waits", "each wait strategy, 50 us to 10 ms steps"),
        ("bench --values", "defer(loss) vs float(loss) vs MaxText's"),
    ) + """
The project's studies (depth='auto' on a simulated device, to= against apex's prefetcher, JAX's
memory) are scripts in benchmarks/ of the source repository, not in the package.
"""

# flags whose studies moved out of the package: what to run instead (main() says so; the parser
# and its --help no longer know them)
_MOVED = {
    "--autodepth": "benchmarks/autodepth.py",
    "--prefetch": "benchmarks/prefetch.py",
}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated ints >= 1 such as 1,2,4, got "
                                         f"{text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"depths must be ints >= 1 such as 1,2,4, got {text!r}")
    return values


def _experiments(text: str) -> list[str]:
    keys = [part.strip() for part in text.split(",") if part.strip()]
    known = [e.key for e in EXPERIMENTS]
    bad = [k for k in keys if k not in known]
    if bad or not keys:
        raise argparse.ArgumentTypeError(
            f"experiments must be a comma-separated subset of {','.join(known)}, got {text!r}"
        )
    return keys


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} > 0, got {text!r}")
        return value

    return parse


def _sim_cost(text: str) -> tuple[str, SimCost]:
    """``NAME=HOST_US:DEVICE_US[:LAUNCHES]``, e.g. ``add=10:100``."""
    fix = "expected NAME=HOST_US:DEVICE_US[:LAUNCHES] such as add=10:100 or train=40:200:3"
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    try:
        host, device = float(parts[0]) * 1e-6, float(parts[1]) * 1e-6
        launches = int(parts[2]) if len(parts) == 3 else 1
        if len(parts) > 3:
            raise ValueError
        return name, SimCost(host, device, launches)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{fix}, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=command("bench"),
        description=textwrap.fill(
            "d2l's three experiments of asynchronous computation (y = x + 1, a matrix product, a "
            "small training loop), measured: each synchronised every step, fully asynchronous, "
            "and throttled, beside d2l's cost model.", 79),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--overhead", action="store_true",
                   help="run the core's overhead benchmark (other flags go to it)")
    p.add_argument("--waits", action="store_true",
                   help="run the wait-strategy sweep (other flags go to it)")
    p.add_argument("--values", action="store_true",
                   help="run deferred values vs float(loss) and MaxText's throttler (other flags "
                        "go to it)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto: cuda, else jax, else simulated")
    p.add_argument("--experiments", type=_experiments, default=[e.key for e in EXPERIMENTS],
                   help="e.g. add,matmul")
    p.add_argument("--depths", type=_int_list, default=[1, 2, 4],
                   help="throttled depths (default 1,2,4)")
    p.add_argument("--scale", type=_positive(float), default=1.0,
                   help="multiply every experiment's step count")
    p.add_argument("--repeat", type=_positive(int), default=1,
                   help="runs per mode; the fastest is kept")
    p.add_argument("--wait", choices=("auto", "poll", "spin", "block", "hybrid", "spin-block"),
                   default="auto",
                   help="the throttle's wait strategy (default: the library's, auto)")
    p.add_argument("--sim-cost", type=_sim_cost, action="append", default=[],
                   metavar="NAME=HOST_US:DEVICE_US",
                   help="simulated per-launch host and device microseconds for add, matmul or "
                        "train")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--plot", metavar="FILE.png",
                   help="save in-flight depth over time per mode (needs matplotlib)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench CLI; returns the process exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--overhead" in args_list:
        from .overhead import main as overhead_main

        return overhead_main([a for a in args_list if a != "--overhead"])
    if "--waits" in args_list:
        from .waits import main as waits_main

        return waits_main([a for a in args_list if a != "--waits"])
    moved = [flag for flag in _MOVED if flag in args_list]
    if moved:
        rest = " ".join(a for a in args_list if a not in _MOVED)
        print(f"error: bench {moved[0]} is a study of the project, not a measurement that chooses "
              f"a setting, and is no longer in the package: run python {_MOVED[moved[0]]} {rest} "
              "from a clone of the source repository", file=sys.stderr)
        return 2
    if "--values" in args_list:
        from .values import main as values_main

        return values_main([a for a in args_list if a != "--values"])
    args = _parser().parse_args(args_list)
    try:
        backend = pick_backend(args.backend, sim_costs=dict(args.sim_cost))
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # fail before measuring, not after
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib: pip install 'asyncthrottle[plot]'",
                  file=sys.stderr)
            return 2
    notes: list[str] = []
    chosen = [e for e in EXPERIMENTS if e.key in args.experiments]
    try:
        results = [
            run_experiment(backend, e, depths=args.depths, scale=args.scale, repeat=args.repeat,
                           sample=bool(args.plot), wait=args.wait)
            for e in chosen
        ]
    finally:
        backend.close()
    label = f"{backend.name}" + (
        " -- SIMULATED, not a real accelerator" if backend.simulated else ""
    )
    if args.plot:
        plot_timelines(results, args.plot, title=f"asyncthrottle bench: {label}")
    if args.json:
        doc = to_json(results, backend=backend.name, simulated=backend.simulated, wait=args.wait,
                      machine=machine(), notes=notes, plot=args.plot)
        print(json.dumps(doc, indent=2))
        return 0
    info = machine()
    header = [
        "asyncthrottle bench: the three experiments, measured",
        f"backend: {label}; wait={args.wait!r}; fastest of {args.repeat} run(s) per mode",
        f"machine: {info['platform']}, {info['cpus']} CPUs, Python {info['python']}, torch "
        f"{info.get('torch', '-')}",
        *(f"note: {n}" for n in notes),
    ]
    print(to_text(results, header))
    if args.plot:
        print(f"\nplot saved to {args.plot}")
    return 0
