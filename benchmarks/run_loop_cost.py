"""What ``run`` adds to the loops themselves (#44 point 9), for ``run_cost.py``: ``run_loops.py``
run plainly and under ``python -m asyncthrottle run``, interleaved, each process timing its own
loops; per loop, the median over rounds of each round's run-against-plain figure, and its range."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOOPS = ROOT / "benchmarks" / "run_loops.py"
# the targets: run adds at most this many µs a training step, and evaluation forwards run at
# least at this share of plain's speed
STEP_TARGET_US = 10.0
EVAL_TARGET = 0.95
_MARK = "run_loops: "


def env(tree: Path = ROOT) -> dict[str, str]:
    """The benchmark processes' environment: ``tree`` (whose asyncthrottle runs) first on the
    path, one OpenMP thread."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def process(argv: list[str], cwd: Path, tree: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` with ``tree``'s asyncthrottle, run to its end; its failure stops the
    benchmark."""
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=cwd,
                          env=env(tree), check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def _output(stdout: str) -> dict[str, Any]:
    """``run_loops.py``'s last line: its training steps and its loops' times."""
    line = next(x for x in reversed(stdout.splitlines()) if x.startswith(_MARK))
    out: dict[str, Any] = json.loads(line[len(_MARK):])
    return out


def _least(times: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """Per loop, [wall µs, CPU µs] per item: the least of the process's timed repeats (another
    process on the machine only ever adds time, to either clock)."""
    return {name: [min(r[k] for r in runs) for k in (0, 1)] for name, runs in times.items()}


def _report(path: Path, trained: int) -> dict[str, Any]:
    """What run counted in its last process (its ``--json``): steps, of the ``trained`` steps
    the script made, and host reads."""
    data = json.loads(path.read_text())
    reads = sum(row.get("count", 0) for row in data.get("syncs") or [])
    return {"steps": data.get("steps"), "trained": trained, "reads": reads}


def measure(args: list[str], rounds: int, cwd: Path, tree: Path = ROOT) -> dict[str, Any]:
    """``run_loops.py ARGS`` plainly and under ``tree``'s run, ``rounds`` times, alternating
    which goes first: each round's per-loop times, and what run counted."""
    report = cwd / "run_report.json"
    plain: list[dict[str, list[float]]] = []
    run: list[dict[str, list[float]]] = []
    trained = 0
    for i in range(rounds):
        for under_run in (False, True) if i % 2 == 0 else (True, False):
            head = ["-m", "asyncthrottle", "run", "--json", str(report)] if under_run else []
            out = _output(process([*head, str(LOOPS), *args], cwd, tree).stdout)
            (run if under_run else plain).append(_least(out["times"]))
            trained = out["steps"]
    return {"plain": plain, "run": run, "report": _report(report, trained)}


def _median_range(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def summary(name: str, plain: list[dict[str, list[float]]],
            run: list[dict[str, list[float]]]) -> dict[str, Any]:
    """One loop's row: medians over rounds of plain's and run's µs, and of each round's run -
    plain (µs), run / plain and plain / run, for wall time and for CPU time."""
    row: dict[str, Any] = {"loop": name}
    for k, clock in enumerate(("wall", "cpu")):
        p, r = [t[name][k] for t in plain], [t[name][k] for t in run]
        row[clock] = {"plain_us": statistics.median(p), "run_us": statistics.median(r),
                      "added_us": _median_range([b - a for a, b in zip(p, r, strict=True)]),
                      "slowdown": _median_range([b / a for a, b in zip(p, r, strict=True)]),
                      "speed": _median_range([a / b for a, b in zip(p, r, strict=True)])}
    step = name.startswith("step/")
    row["target"] = (f"<= +{STEP_TARGET_US:g} us" if step else f">= {EVAL_TARGET:g}x")
    for clock in ("wall", "cpu"):
        figures = row[clock]
        figures["met"] = (figures["added_us"]["median"] <= STEP_TARGET_US if step
                          else figures["speed"]["median"] >= EVAL_TARGET)
    return row


def _figure(stat: dict[str, Any], fmt: str) -> str:
    low, high = stat["range"]
    return f"{stat['median']:{fmt}} [{low:{fmt}}..{high:{fmt}}]"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as text: training steps by µs added a step, evaluation by plain / run."""
    lines = []
    for row in rows:
        wall, cpu = row["wall"], row["cpu"]
        step = row["loop"].startswith("step/")
        key, fmt = ("added_us", "+.1f") if step else ("speed", ".3f")
        met = "/".join("met" if row[c]["met"] else "NOT met" for c in ("wall", "cpu"))
        lines.append(
            f"  {row['loop']:<25} {wall['plain_us']:8.1f} {wall['run_us']:8.1f}  "
            f"{_figure(wall[key], fmt):<26} x{_figure(wall['slowdown'], '.3f'):<22} "
            f"{_figure(cpu[key], fmt):<26} {row['target']}: {met}")
    return lines


def header() -> str:
    """The table's column names."""
    return (f"  {'loop':<25} {'plain us':>8} {'run us':>8}  {'wall: added us / speed':<26} "
            f"{'wall: run / plain':<23} {'CPU: added us / speed':<26} target: wall/CPU")
