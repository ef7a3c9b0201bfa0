"""What ``python -m asyncthrottle run`` costs a script (#39, #44 point 9), plain ``python``
against ``run``, in interleaved rounds (alternating which goes first); each figure is the median
over rounds of each round's comparison, with its range [min..max].

``--what`` chooses the measurements (comma-separated; default ``step,eval``):

- ``step``: what run adds to a tiny training step (a 32-64-10 MLP, SGD, batch 8, no host read in
  the loop), over pre-made tensors (``step/tensors``) and over a DataLoader (``step/loader``):
  ``benchmarks/run_loops.py`` times its own loops (``time.perf_counter``; CPU time by
  ``time.process_time`` beside it), so process start-up and imports are left out. The figure:
  run - plain in µs a step (target: at most +10 µs), and run / plain.
- ``eval``: evaluation forwards of a model of 41 small submodules after a few training steps,
  ``eval()`` + ``no_grad``, ``eval()`` + ``inference_mode``, and ``no_grad`` alone. The figure:
  plain / run, the speed under run against plain's (target: at least 0.95).
- ``mnist``, ``plain``: the whole process's wall and CPU time (user + system) of
  examples/mnist.py on generated data, and of a plain PyTorch loop with no asyncthrottle in it (a
  DataLoader, Adam, ``loss.item()`` every 10 steps; ``--steps`` steps), written to a temporary
  folder (#39's target: 5 % or less). ``--scripts`` is the older spelling of these two.

    python benchmarks/run_cost.py [--what step,eval,mnist,plain] [--rounds 5] [--repeats 5]
        [--loop-steps 200] [--batches 100] [--steps 300] [--tree PATH] [--no-warm-up] [--json]

``--rounds``: processes of each way (plain, run) per measurement; ``--repeats``: timed loops of
each kind in one process, interleaved, after one untimed warm-up (the process's figure is the
least of them: another process on a shared machine only ever adds time);
``--loop-steps``: training steps per timed loop; ``--batches``: evaluation batches per timed loop;
``--tree``: the source tree whose asyncthrottle runs (default: this checkout; to measure another
commit: ``git archive COMMIT asyncthrottle | tar -x -C DIR``, then ``--tree DIR``).
The load average at the start and the end is printed: on a shared machine read the CPU columns
(the process's CPU time) beside the wall ones. Under run the script also writes run's report
(``--json``): its steps (against those the script made) and host reads are printed with the
loops, to show that run saw the steps and that no counted read is in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run_loop_cost
from run_loop_cost import process  # (benchmarks/, this script's own folder)

ROOT = Path(__file__).resolve().parent.parent

PLAIN = '''"""A plain PyTorch training loop: what a user's unchanged script looks like."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1])
torch.manual_seed(0)
x, y = torch.randn(steps * 32, 64), torch.randint(0, 10, (steps * 32,))
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for i, (xb, yb) in enumerate(loader):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    if i % 10 == 0:
        print(f"step {i} loss {loss.item():.4f}")
'''


def scripts(folder: Path, steps: int) -> dict[str, list[str]]:
    """Each script's command line after ``python`` (the same for both ways of running it)."""
    plain = folder / "plain_loop.py"
    plain.write_text(PLAIN)
    mnist = [str(ROOT / "examples" / "mnist.py"), "--data", "synthetic", "--device", "cpu",
             "--no-progress", "--batch-size", "32", "--epochs", "1", "--max-steps", str(steps)]
    return {"mnist": mnist, "plain": [str(plain), str(steps)]}


def _wall(argv: list[str], cwd: Path, tree: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one process, start to exit; its failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process(argv, cwd, tree)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _ratios(plain: list[float], run: list[float]) -> dict[str, Any]:
    ratios = sorted(b / a for a, b in zip(plain, run, strict=True))
    return {"plain": statistics.median(plain), "run": statistics.median(run),
            "ratio": statistics.median(ratios), "spread": [ratios[0], ratios[-1]]}


def measure(names: list[str], steps: int, rounds: int, tree: Path = ROOT,
            warm: bool = True) -> list[dict[str, Any]]:
    """Per script: the median wall times and the median run/plain ratio of interleaved rounds
    (``warm``: after an untimed process that warms the file cache)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        commands = scripts(folder, steps)
        for name in names:
            argv = commands[name]
            if warm:
                _wall(argv, folder, tree)  # warm the file cache
            plain: list[tuple[float, float]] = []
            run: list[tuple[float, float]] = []
            for i in range(rounds):  # interleaved, alternating which goes first
                for under_run in ((False, True) if i % 2 == 0 else (True, False)):
                    command = ["-m", "asyncthrottle", "run", *argv] if under_run else argv
                    (run if under_run else plain).append(_wall(command, folder, tree))
            wall = _ratios([p[0] for p in plain], [r[0] for r in run])
            cpu = _ratios([p[1] for p in plain], [r[1] for r in run])
            rows.append({"script": name, "steps": steps, "plain_s": wall["plain"],
                         "run_s": wall["run"], "ratio": wall["ratio"],
                         "ratio_spread": wall["spread"], "plain_cpu_s": cpu["plain"],
                         "run_cpu_s": cpu["run"], "cpu_ratio": cpu["ratio"],
                         "cpu_ratio_spread": cpu["spread"]})
    return rows


def loops(what: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The timed loops of ``what`` (step, eval): a row per loop, and what run counted."""
    parts = [w for w in ("step", "eval") if w in what]
    if not parts:
        return {"rows": [], "report": None}
    argv = [",".join(parts), str(args.loop_steps), str(args.batches), str(args.repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        got = run_loop_cost.measure(argv, args.rounds, Path(tmp), args.tree)
    names = list(got["plain"][0])
    return {"rows": [run_loop_cost.summary(name, got["plain"], got["run"]) for name in names],
            "report": got["report"]}


def _parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", default=None, help="step,eval,mnist,plain (default: step,eval)")
    p.add_argument("--scripts", default="", help="mnist,plain: the whole-process comparisons")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loop-steps", type=int, default=200)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tree", type=Path, default=ROOT,
                   help="the source tree whose asyncthrottle runs (default: this checkout)")
    p.add_argument("--no-warm-up", dest="warm", action="store_false",
                   help="mnist, plain: no untimed first process to warm the file cache (a check "
                        "that the benchmark runs, not figures)")
    p.add_argument("--json", action="store_true")
    return p, p.parse_args(argv)


def _what(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The measurements asked for, checked."""
    scripts = [s for s in args.scripts.split(",") if s]
    if not set(scripts) <= {"mnist", "plain"}:
        p.error(f"--scripts must be a comma-separated subset of mnist,plain, got {args.scripts!r}")
    default = "" if scripts and args.what is None else "step,eval"
    what = [w for w in (args.what if args.what is not None else default).split(",") if w]
    if not set(what) <= {"step", "eval", "mnist", "plain"} or not what + scripts:
        p.error("--what must be a comma-separated subset of step,eval,mnist,plain, got "
                f"{args.what!r}")
    numbers = (args.rounds, args.repeats, args.loop_steps, args.batches, args.steps)
    if min(numbers) < 1:
        p.error("--rounds, --repeats, --loop-steps, --batches and --steps must be >= 1, got "
                f"{', '.join(map(str, numbers))}")
    return [*what, *(s for s in scripts if s not in what)]


def _print(out: dict[str, Any]) -> None:
    load = " .. ".join(f"{a:.1f}" for a in out["load"])
    print(f"{out['rounds']} interleaved rounds of each (alternating which goes first), load "
          f"average {load} on {os.cpu_count()} CPUs; median [min..max] of the rounds")
    if out["loops"]:
        report = out["report"]
        print(f"the loops' own timing, the least of {out['repeats']} timed loops a process; per "
              "step (step/) or batch (eval/); speed = plain / run; run counted "
              f"{report['steps']} of the script's {report['trained']} steps and "
              f"{report['reads']} host reads:")
        print(run_loop_cost.header())
        print("\n".join(run_loop_cost.table(out["loops"])))
    if out["rows"]:
        print("the whole process (wall and CPU time); ratio: run / plain")
    for row in out["rows"]:
        low, high = row["ratio_spread"]
        cpu_low, cpu_high = row["cpu_ratio_spread"]
        print(f"  {row['script']:<6} {row['steps']} steps  wall: python {row['plain_s']:6.2f} s  "
              f"run {row['run_s']:6.2f} s  ratio {row['ratio']:.3f} ({low:.3f} .. {high:.3f})   "
              f"CPU: python {row['plain_cpu_s']:6.2f} s  run {row['run_cpu_s']:6.2f} s  ratio "
              f"{row['cpu_ratio']:.3f} ({cpu_low:.3f} .. {cpu_high:.3f})")


def main(argv: list[str] | None = None) -> int:
    p, args = _parse(argv)
    what = _what(p, args)
    start = os.getloadavg()[0]
    timed = loops(what, args)
    names = [w for w in what if w in ("mnist", "plain")]
    rows = measure(names, args.steps, args.rounds, args.tree, args.warm) if names else []
    out = {"tree": str(args.tree), "rounds": args.rounds, "repeats": args.repeats,
           "loop_steps": args.loop_steps, "batches": args.batches,
           "load": [start, os.getloadavg()[0]],
           "loops": timed["rows"], "report": timed["report"], "rows": rows}
    if args.json:
        print(json.dumps(out))
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
