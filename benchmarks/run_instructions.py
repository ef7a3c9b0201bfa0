"""The instructions a training step executes under each layer of ``run`` (#44 point 9): exact
counts, the same from run to run whatever the machine's load, where a timing on a shared 2-core
machine spreads wider than the differences it looks for.

The tiny step of ``run_calls.py`` under each of ``run_step_split.py``'s layers (plain, the floor,
the step rules, run without and with its sync audit), all in one process run by valgrind's
callgrind, which counts only between the two calls of a small C helper (built here with ``cc``
against valgrind's ``callgrind.h``) around each layer's ``--steps`` steps, after 60 untimed ones;
one torch thread, ``PYTHONHASHSEED=0``. Needs ``valgrind`` (with its headers) and a C compiler;
about 20 s a layer. Between two trees the plain step moves by up to 3k instructions (memory
layout): read differences under about 2k as noise.

    python benchmarks/run_instructions.py [--loop step/tensors] [--steps 400] [--floor]
        [--no-valgrind]

``--no-valgrind`` counts nothing: each layer's steps run natively, the helper's marks doing
nothing outside valgrind, and each runner's steps are checked (what the test suite runs: the
counted run imports torch under valgrind, a minute and more on its own).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_HELPER = """#include <valgrind/callgrind.h>
void start(void) {
    CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; CALLGRIND_TOGGLE_COLLECT;
}
void stop(void) {
    CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION;
}
"""
_WARM = 60


def counted(loop: str, steps: int, floor: bool, helper: str) -> None:
    """In valgrind: each layer's steps between the helper's ``start()`` and ``stop()`` (a dump
    each, in the layers' order)."""
    import run_calls  # (benchmarks/, this script's own folder)
    import run_step_split
    import torch

    torch.set_num_threads(1)
    made, optimizer = run_calls.loops()
    step = made[loop]
    marks = ctypes.CDLL(helper)
    for inside in run_step_split.layers(optimizer, floor=floor).values():
        with inside() as runner:
            step(_WARM)
            marks.start()
            step(steps)
            marks.stop()
            run_step_split.check(runner, _WARM + steps)


def _build(folder: Path) -> Path:
    source, built = folder / "marks.c", folder / "marks.so"
    source.write_text(_HELPER)
    done = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(built), str(source)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"building the callgrind helper failed (is valgrind's callgrind.h "
                         f"installed, e.g. apt-get install valgrind?):\n{done.stderr}")
    return built


def _totals(folder: Path) -> list[int]:
    """Each dump's instructions, in the order they were written (``cg.out.PID.1``, ``.2``...)."""
    dumps = sorted(folder.glob("cg.out.*.*"), key=lambda path: int(path.name.rsplit(".", 1)[1]))
    found = []
    for dump in dumps:
        totals = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.MULTILINE)
        if totals is None:
            raise SystemExit(f"{dump} holds no instruction count")
        found.append(int(totals.group(1)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", default="step/tensors", choices=("step/tensors", "step/loader"))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--floor", action="store_true",
                        help="also count each of the floor's places alone")
    parser.add_argument("--no-valgrind", action="store_true",
                        help="count nothing: run and check each layer's steps natively")
    parser.add_argument("--in-valgrind", metavar="HELPER", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.in_valgrind:
        counted(args.loop, args.steps, args.floor, args.in_valgrind)
        return
    if args.no_valgrind:
        with tempfile.TemporaryDirectory() as where:
            counted(args.loop, args.steps, args.floor, str(_build(Path(where))))
        print(f"{args.loop}: each layer ran and found its {_WARM + args.steps} steps (not counted)")
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    import run_step_split  # (the layers' names)

    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        helper = _build(folder)
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                   f"--callgrind-out-file={folder}/cg.out.%p", sys.executable, __file__,
                   "--loop", args.loop, "--steps", str(args.steps), "--in-valgrind", str(helper)]
        if args.floor:
            command.append("--floor")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the counted run failed:\n{done.stderr[-4000:]}")
        totals = _totals(folder)
    names = list(run_step_split.layers(None, floor=args.floor))
    if len(totals) != len(names):
        raise SystemExit(f"{len(totals)} counts for {len(names)} layers: {totals}")
    plain = totals[0] / args.steps
    print(f"{args.loop}: instructions a step (callgrind, {args.steps} steps a layer), and added "
          f"to plain")
    for name, total in zip(names, totals, strict=True):
        each = total / args.steps
        print(f"  {name:16s} {each / 1000:9.1f}k  added {(each - plain) / 1000:+7.1f}k")


if __name__ == "__main__":
    main()
