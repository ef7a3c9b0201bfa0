"""Every GPU figure in one run: ``benchmarks/gpu.sh [REPORT.md]`` from the source tree.

Runs a list of steps (each a title and a function returning markdown) and writes
one markdown report, rewritten after every step so a cut-short run keeps what it
measured. Without CUDA it says so and exits 0. To add a section, append a
``Step`` to ``STEPS`` (or call :func:`run` with your own list); each step gets the
remaining time budget and should stay within its own ``budget_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@dataclasses.dataclass(frozen=True)
class Step:
    """One section of the report: ``run(budget_s)`` returns its markdown body."""

    title: str
    budget_s: float
    run: Callable[[float], str]


def shell(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    """Run a command from the source tree; returns (exit status, stdout and stderr)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        proc = subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n[timed out after {timeout_s:.0f} s]"
    return proc.returncode, proc.stdout + proc.stderr


def command_section(argv: Sequence[str], tail: int = 80) -> Callable[[float], str]:
    """A step that runs ``argv`` and reports the command, its status and its output's last lines."""

    def run(budget_s: float) -> str:
        start = time.perf_counter()
        status, out = shell(argv, budget_s)
        lines = out.rstrip().splitlines()[-tail:]
        return (f"Command: `{shlex.join(argv)}` (exit {status}, {time.perf_counter() - start:.0f} "
                "s)\n\n```\n" + "\n".join(lines) + "\n```\n")

    return run


def environment(budget_s: float) -> str:
    """The machine, the GPU and the versions."""
    import torch

    _, smi = shell(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                    "--format=csv,noheader"], min(budget_s, 20))
    return (f"- GPU: {torch.cuda.get_device_name(0)} ({smi.strip()})\n"
            f"- host: {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}\n"
            f"- torch {torch.__version__}, CUDA {torch.version.cuda}\n"
            f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")


MNIST_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("2", ("--depth", "2")),
    ("2 + .item() every step", ("--depth", "2", "--item-every-step")),
)
# the example's device-bound setting (docs/getting-started.md)
WIDE = ("--width", "32", "--batch-size", "256")
WIDE_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("none", ("--depth", "none", *WIDE)),
    ("1", ("--depth", "1", *WIDE)),
    ("2", ("--depth", "2", *WIDE)),
    ("auto", ("--depth", "auto", *WIDE)),
    ("2 + .item() every step", ("--depth", "2", "--item-every-step", *WIDE)),
)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f}"


def mnist(budget_s: float, runs: Sequence[tuple[str, Sequence[str]]] = MNIST_RUNS,
          max_steps: int = 400) -> str:
    """examples/mnist.py per setting (synthetic data, one epoch): steps/s, run-ahead, waits, memory,
    verdict."""
    rows = [
        "| depth | steps/s | max in flight | host wait % | device idle % | peak pinned host "
        "MiB | peak device MiB | depth at end (changes) | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    notes = []
    per_run = budget_s / max(1, len(runs))
    for label, flags in runs:
        argv = [
            PYTHON, str(ROOT / "benchmarks" / "_mnist_run.py"), "--data", "synthetic", "--epochs",
            "1", "--max-steps", str(max_steps), "--no-progress", *flags,
        ]
        status, out = shell(argv, per_run)
        result = next(
            (json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None
        )
        if status or result is None:
            rows.append(f"| {label} | failed (exit {status}) | | | | | | | |")
            notes.append(
                f"`{shlex.join(argv)}`:\n```\n" + "\n".join(out.splitlines()[-15:]) + "\n```"
            )
            continue
        idle = result["idle_fraction"]
        rows.append(f"| {label} | {result['steps_per_s']:.1f} | {result['max_in_flight']} | "
                    f"{result['wait_fraction']:.1%} | {'n/a' if idle is None else f'{idle:.1%}'} | "
                    f"{_mib(result.get('pinned_peak_bytes'))} | "
                    f"{_mib(result.get('device_peak_bytes'))} | {result.get('depth')} "
                    f"{result.get('depth_changes') or ''} | {result.get('verdict', '')} |")
    shared = sorted({flag for _, flags in runs for flag in flags if flag in WIDE})
    head = (
        f"`benchmarks/_mnist_run.py --data synthetic --epochs 1 --max-steps {max_steps} "
        f"--no-progress --depth D{' ' + ' '.join(WIDE) if shared else ''}` (examples/mnist.py's "
        "train(); max in flight at depth none is how far the host ran ahead; device idle is "
        "the throttle's lower bound; pinned memory held by live blocks from "
        "torch.cuda.host_memory_stats() as asyncthrottle.pinned reads it, n/a where this torch "
        "lacks it; device memory is torch.cuda.max_memory_allocated())\n\n"
    )
    return head + "\n".join(rows) + "\n" + "\n\n".join(notes)


def mnist_wide(budget_s: float) -> str:
    """The example's device-bound setting, side by side: depth none, 1, 2, auto and .item() every
    step."""
    return mnist(budget_s, WIDE_RUNS, max_steps=200)


_MAX_MEMORY = """
import torch, asyncthrottle as at
from asyncthrottle.backends.memory import cuda_probe
from asyncthrottle.backends.pinned import bytes_trusted, pinned_in_use
dev = torch.device("cuda")
w = torch.randn(4096, 4096, device=dev)
torch.empty(16, 2**20).pin_memory().to(dev, non_blocking=True)  # warm both allocators
torch.cuda.synchronize()
STEP = 64 * 2**20  # pinned per step
rates = {}
# 192 MiB: room for 2 steps in flight beside the one being handed out
for budget_mib in (None, 192):
    probe = cuda_probe(dev)
    base = probe()
    options = {} if budget_mib is None else {"max_memory": base + budget_mib * 2**20}
    thr = at.Throttle(8, device=dev, **options)
    seen = []  # the probe above base at every hand-out
    thr.subscribe(type("Seen", (), {
        "on_handout": lambda self, step, n, now: seen.append(probe() - base)})())
    for i in thr.wrap(range(200)):
        # 64 MiB pinned
        x = torch.full((16, 2**20), float(i % 7)).pin_memory().to(dev, non_blocking=True)
        for _ in range(20):
            w = torch.tanh(w @ w)
        w = w + 1e-9 * x.mean()
    rates[budget_mib] = thr.stats.steps_per_s
    print(f"budget={budget_mib} MiB above base {base / 2**20:.0f} MiB; torch {torch.__version__}, "
          "in-use bytes "
          f"{'read' if bytes_trusted(torch.__version__) else 'estimated from block counts'}")
    print(thr.summary())
    print(f"probe above base at hand-outs: max {max(seen) / 2**20:.0f} MiB over {len(seen)} "
          "hand-outs")
    if budget_mib is not None:
        ok = max(seen) <= budget_mib * 2**20 + STEP
        print(f"every hand-out within budget + one step ({budget_mib + 64} MiB): {ok}; "
              f"throughput vs no budget {rates[budget_mib] / rates[None]:.3f}x (target >= 0.95)")
    stats = getattr(torch.cuda, "host_memory_stats", dict)()
    peak = pinned_in_use(stats, "peak", trust_bytes=bytes_trusted(torch.__version__))
    print(f"peak pinned in use {peak / 2**20:.0f} MiB")
"""


def _excerpt(out: str, keys: Sequence[str]) -> str:
    return "\n".join(line for line in out.splitlines() if any(key in line for key in keys))


FRAMEWORK_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Lightning, advice applied (no prog_bar logging, sync-free bar off)",
        ("examples/lightning_mnist.py", "--no-progress"),
    ),
    (
        "Lightning, self.log(..., prog_bar=True) with Lightning's bar",
        ("examples/lightning_mnist.py", "--prog-bar-log"),
    ),
    (
        "transformers, advice applied (logging_nan_inf_filter=False)",
        ("examples/transformers_mnist.py", "--grad-accum", "2", "--no-progress"),
    ),
    (
        "transformers, default logging_nan_inf_filter=True",
        (
            "examples/transformers_mnist.py", "--grad-accum", "2", "--nan-inf-filter",
            "--no-progress",
        ),
    ),
)


def frameworks(budget_s: float, max_steps: int = 400) -> str:
    """The framework examples with the sync audit on: syncs per step and their sites, steps/s.

    One run each (10-15 s with imports on the H200), so that all of them fit.
    """
    parts = []
    per_run = budget_s / len(FRAMEWORK_RUNS)
    for label, (script, *flags) in FRAMEWORK_RUNS:
        for audit in (("--detect-sync",),):
            argv = [PYTHON, script, "--data", "synthetic", "--device", "cuda", "--epochs", "1",
                    "--max-steps", str(max_steps), *flags, *audit]
            status, out = shell(argv, per_run)
            shown = _excerpt(out, ("fit:", "train:", "asyncthrottle:", "syncs", "steps/s", "Error"))
            parts.append(f"**{label}**, audit {'on' if audit else 'off'}: `{shlex.join(argv)}` "
                         f"(exit {status})\n\n```\n{shown}\n```\n")
    return "\n".join(parts)


def timelines(budget_s: float, max_steps: int = 200) -> str:
    """Traces of the MNIST example at depth 1 and 2, rendered beside the report."""
    parts = []
    for depth in ("1", "2"):
        trace = OUT_DIR / f"mnist-cuda-depth{depth}.json"
        picture = OUT_DIR / f"mnist-cuda-depth{depth}.png"
        run_argv = [
            PYTHON, "examples/mnist.py", "--device", "cuda", "--data", "synthetic", "--epochs", "1",
            "--max-steps", str(max_steps), "--depth", depth, "--no-progress", "--trace", str(trace),
        ]
        plot_argv = [PYTHON, "-m", "asyncthrottle", "plot", str(trace), "-o", str(picture),
                     "--title", f"MNIST example on CUDA, depth {depth}"]
        status, out = shell(run_argv, budget_s / 4)
        plot_status, plot_out = shell(plot_argv, budget_s / 4)
        parts.append(
            f"depth {depth}: `{shlex.join(run_argv)}` (exit {status}), "
            f"`{shlex.join(plot_argv)}` (exit {plot_status}) -> "
            f"`{picture.name}`\n\n```\n"
            f"{_excerpt(out + plot_out, ('asyncthrottle:', 'verdict', 'device:', 'Error'))}\n```\n"
        )
    return "\n".join(parts)


# where traces and pictures go: the report's folder (set by run())
OUT_DIR = Path(".")

# Each budget is what the section took on the H200 (2026-12-01) with room; they add up to TOTAL_S
# (9 minutes): one run fits a session's 15 minutes of device time with the machine's start and a
# partial rerun (--total-s to shorten one), not two full runs. One command may run 10 minutes.
STEPS: list[Step] = [
    Step("Environment", 10, environment),
    # 17 s, before tests/run/test_cuda.py (not yet run: ~30 s of a compile with inductor, three
    # pairs of ~10 s); -o addopts= drops the project's -n auto (the GPU machine may lack
    # pytest-xdist)
    Step(
        "CUDA-marked tests, run's included",
        85,
        command_section([PYTHON, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                         "-o", "addopts=", "-rs"], tail=30),
    ),
    # 45 s
    Step(
        "Core overhead and waits (bench --overhead)",
        50,
        command_section(
            [PYTHON, "-m", "asyncthrottle", "bench", "--overhead", "--steps", "300000"]
        ),
    ),
    Step(
        "The three experiments on CUDA (bench --backend cuda)",
        35,
        command_section(
            [PYTHON, "-m", "asyncthrottle", "bench", "--backend", "cuda", "--repeat", "3"]
        ),
    ),
    # capped at 45 s by itself
    Step(
        "Wait strategies with CUDA events (bench --waits --backend cuda)",
        50,
        command_section(
            [
                PYTHON, "-m", "asyncthrottle", "bench", "--waits", "--backend", "cuda", "--repeats",
                "3", "--max-s", "45",
            ]
        ),
    ),
    # ~10 s a run
    Step("examples/mnist.py as it ships (host-bound on a large GPU)", 25, mnist),
    # ~12 s a run
    Step("examples/mnist.py --width 32 --batch-size 256 (device-bound) by depth", 75, mnist_wide),
    # 39 s
    Step("max_memory with the default CUDA probe, depth 8, 64 MiB pinned per step (#11)", 45,
         command_section([PYTHON, "-c", _MAX_MEMORY], tail=40)),
    # 10-15 s a run
    Step("Lightning and transformers examples: the sync audit (#9)", 60, frameworks),
    Step(
        "The stall report: examples/ddp_mnist.py --hang on one rank (#19)",
        15,
        # not yet run: ~8 s of imports, the 2 s hang at step 20, then the rest; the report is a
        # WARNING log
        command_section(
            [
                PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                "examples/ddp_mnist.py", "--data", "synthetic", "--epochs", "1", "--max-steps",
                "60", "--no-progress", "--hang", "0:20:2", "--stall", "0.5",
            ],
            tail=40,
        ),
    ),
    # not yet timed: 2 runs of 200 steps, 2 plots
    Step("Timelines of the MNIST example (#12)", 20, timelines),
    Step(
        "to= against apex-style and non_blocking copies, 8 MiB batches (benchmarks/prefetch.py, "
        "#18)",
        30,
        # ~22 s (not yet run): 1000 steps of 2 ms per run, four modes, twice; the targets print as
        # `target:`
        command_section(
            [
                PYTHON, "benchmarks/prefetch.py", "--backend", "cuda", "--steps", "1000",
                "--repeat", "2", "--device-ms", "2",
            ],
            tail=20,
        ),
    ),
    Step(
        "The loss every step: defer vs .item() vs MaxText's pattern vs by hand; y = x + 1 "
        "deferred vs the pooled reference with its pinned ring (bench --values --backend cuda, "
        "#26)",
        20,
        # not yet run: 6 modes x 2 sizes x 3 rounds at half the step counts, then 4 loops x 3
        # rounds of 2,500 x + 1 steps (~1 s); the budget was taken from the two rows above (their
        # runs fit in 60 s)
        command_section(
            [
                PYTHON, "-m", "asyncthrottle", "bench", "--values", "--backend", "cuda", "--rounds",
                "3", "--scale", "0.5",
            ],
            tail=20,
        ),
    ),
    Step(
        "Trace overhead (bench --overhead --trace)",
        20,
        command_section(
            [
                PYTHON, "-m", "asyncthrottle", "bench", "--overhead", "--trace", "10000", "--runs",
                "3",
            ]
        ),
    ),
]
# 9 minutes: the budgets above add up to it
TOTAL_S = 540.0


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(report: Path, steps: Sequence[Step] = STEPS, total_s: float = TOTAL_S) -> None:
    """Run ``steps`` in order within ``total_s``, rewriting ``report`` after each one."""
    global OUT_DIR
    OUT_DIR = report.resolve().parent
    start = time.perf_counter()
    parts = ["# asyncthrottle GPU report\n", f"Generated by `benchmarks/gpu.sh` in {ROOT.name}.\n"]
    for step in steps:
        left = total_s - (time.perf_counter() - start)
        if left < 10:
            parts.append(f"## {step.title}\n\nSkipped: the run's time budget ({total_s:.0f} s) was "
                         "spent.\n")
            continue
        print(f"[gpu.sh] {step.title} (up to {min(step.budget_s, left):.0f} s)", flush=True)
        try:
            body = step.run(min(step.budget_s, left))
        except Exception as exc:
            # one broken section must not lose the others
            body = f"Failed: {type(exc).__name__}: {exc}\n"
        parts.append(f"## {step.title}\n\n{body}")
        report.write_text("\n".join(parts))
    report.write_text("\n".join(parts))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", nargs="?", default="gpu-report.md",
                   help="markdown report path (default gpu-report.md)")
    p.add_argument("--total-s", type=float, default=TOTAL_S,
                   help=f"time budget for all steps (default {TOTAL_S:.0f} s)")
    args = p.parse_args(argv)
    if not cuda_available():
        print("benchmarks/gpu.sh: no CUDA GPU here (torch.cuda.is_available() is False, or torch "
              "is missing); nothing measured, no report written. Run it on a machine with a CUDA "
              "GPU.")
        return 0
    report = Path(args.report)
    run(report, total_s=args.total_s)
    print(f"[gpu.sh] report written to {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
