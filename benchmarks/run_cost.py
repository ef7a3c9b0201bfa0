"""What ``python -m asyncthrottle run`` costs a script (#39): the wall time of ``python SCRIPT
ARGS`` against ``python -m asyncthrottle run SCRIPT ARGS``, interleaved runs, the median ratio and
its spread (the target: 5 % or less); and the processes' CPU time (user + system), which a busy
shared machine disturbs less. The scripts: examples/mnist.py on generated data, and a plain
PyTorch loop with no asyncthrottle in it (a DataLoader, Adam, ``loss.item()`` every 10 steps),
written to a temporary folder.

    python benchmarks/run_cost.py [--scripts mnist,plain] [--steps 300] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def _wall(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one process, start to exit; its failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
                          env=_env(), check=False, timeout=1800)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _ratios(plain: list[float], run: list[float]) -> dict[str, Any]:
    ratios = sorted(b / a for a, b in zip(plain, run, strict=True))
    return {"plain": statistics.median(plain), "run": statistics.median(run),
            "ratio": statistics.median(ratios), "spread": [ratios[0], ratios[-1]]}


def measure(names: list[str], steps: int, rounds: int) -> list[dict[str, Any]]:
    """Per script: the median wall times and the median run/plain ratio of interleaved rounds."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        commands = scripts(folder, steps)
        for name in names:
            argv = commands[name]
            _wall(argv, folder)  # warm the file cache
            plain: list[tuple[float, float]] = []
            run: list[tuple[float, float]] = []
            for i in range(rounds):  # interleaved, alternating which goes first
                for under_run in ((False, True) if i % 2 == 0 else (True, False)):
                    command = ["-m", "asyncthrottle", "run", *argv] if under_run else argv
                    (run if under_run else plain).append(_wall(command, folder))
            wall = _ratios([p[0] for p in plain], [r[0] for r in run])
            cpu = _ratios([p[1] for p in plain], [r[1] for r in run])
            rows.append({"script": name, "steps": steps, "plain_s": wall["plain"],
                         "run_s": wall["run"], "ratio": wall["ratio"],
                         "ratio_spread": wall["spread"], "plain_cpu_s": cpu["plain"],
                         "run_cpu_s": cpu["run"], "cpu_ratio": cpu["ratio"],
                         "cpu_ratio_spread": cpu["spread"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", default="mnist,plain")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = args.scripts.split(",")
    if not names or not set(names) <= {"mnist", "plain"}:
        p.error(f"--scripts must be a comma-separated subset of mnist,plain, got {args.scripts!r}")
    if args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1")
    rows = measure(names, args.steps, args.rounds)
    if args.json:
        print(json.dumps({"rounds": args.rounds, "rows": rows}))
        return 0
    print(f"{args.rounds} interleaved rounds of each; the whole process's wall and CPU time "
          "(median); ratio: run / plain (median, min..max)")
    for row in rows:
        low, high = row["ratio_spread"]
        cpu_low, cpu_high = row["cpu_ratio_spread"]
        print(f"  {row['script']:<6} {row['steps']} steps  wall: python {row['plain_s']:6.2f} s  "
              f"run {row['run_s']:6.2f} s  ratio {row['ratio']:.3f} ({low:.3f} .. {high:.3f})   "
              f"CPU: python {row['plain_cpu_s']:6.2f} s  run {row['run_cpu_s']:6.2f} s  ratio "
              f"{row['cpu_ratio']:.3f} ({cpu_low:.3f} .. {cpu_high:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
