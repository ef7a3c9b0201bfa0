"""The per-step overhead of two revisions of asyncthrottle, measured in one run:
``bench --overhead``'s loops.

Usage: ``python benchmarks/compare_trees.py OLD_REV NEW_REV [--rounds 7] [--steps 100000]``

Each revision is exported with ``git archive`` and measured in its own child process, the two
alternating round by round (so load on the machine falls on both alike). Each round runs that
tree's ``measure_overhead`` (thread CPU time over a bare loop, best of 3 loops); the table shows
the median over rounds of each loop's microseconds per step, its range, and new / old; then (the
``_x`` rows) the median of each round's ratio to the 10-line generator measured in that round,
the figure ``bench --overhead`` prints, less blurred by the machine's drift.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

_ROUND = (
    "import json, sys; from asyncthrottle.bench.overhead import measure_overhead; "
    "print(json.dumps(measure_overhead(int(sys.argv[1]), 1)))"
)
_LOOPS = (
    "null_us", "noop_events_us", "timed_events_us", "timed_events_no_sampling_us", "reference_us",
    "generator_us",
    # each round's overhead over the 10-line generator's, in the same round of the same tree
    "null_x", "noop_events_x", "timed_events_x", "timed_events_no_sampling_x",
)


def _export(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    tree = into / rev.replace("/", "_")
    tree.mkdir()
    with tempfile.TemporaryFile() as tmp:
        tmp.write(archive)
        tmp.seek(0)
        tarfile.open(fileobj=tmp).extractall(tree, filter="data")
    return tree


def _round(tree: Path, steps: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _ROUND, str(steps)], cwd=tree, check=True,
                         capture_output=True, text=True,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: _export(rev, Path(tmp)) for rev in (args.old, args.new)}
        runs: dict[str, list[dict[str, float]]] = {rev: [] for rev in trees}
        for k in range(args.rounds):
            order = list(trees) if k % 2 == 0 else list(reversed(trees))
            for rev in order:
                runs[rev].append(_round(trees[rev], args.steps))
    print(f"per-step overhead over a bare loop, us (median of {args.rounds} alternating rounds "
          f"[range]; {args.steps:,} steps, best of 3 loops each)")
    print(f"  {'loop':32} {args.old[:12]:>22} {args.new[:12]:>22}   new/old")
    for loop in _LOOPS:
        cells, medians = [], []
        for rev in (args.old, args.new):
            values = [r[loop] for r in runs[rev] if loop in r]
            median = statistics.median(values) if values else float("nan")
            medians.append(median)
            cells.append(
                f"{median:8.3f} [{min(values):.3f}..{max(values):.3f}]" if values else "n/a"
            )
        print(f"  {loop:32} {cells[0]:>22} {cells[1]:>22}   {medians[1] / medians[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
