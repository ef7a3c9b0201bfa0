"""The Python and C calls a training step makes under ``run``'s hooks beyond a plain loop
(#44 point 9): exact counts (``sys.setprofile``), unlike a timing, whatever the machine's load.

In one process: the tiny step of ``run_loops.py`` (a 32-64-10 MLP, SGD, batch 8) over a list of
tensors and over a DataLoader, 400 steps plain, then the same under the runner's hooks and sync
audit, installed as ``run`` installs them (observe only). To count another commit's package:
``git archive COMMIT asyncthrottle | tar -x -C DIR``, then ``PYTHONPATH=DIR python
benchmarks/run_calls.py``.

    python benchmarks/run_calls.py [--steps 400]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import run_loops  # (benchmarks/, this script's own folder)
import torch
from _calls import calls_per_step
from torch.utils.data import DataLoader, TensorDataset

from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run import torchhooks
from asyncthrottle.run.patches import Patches
from asyncthrottle.run.steps import SAMPLE_EVERY, Steps
from asyncthrottle.run.syncsites import SyncSites

_BATCHES = 2000


def loops() -> dict[str, Callable[[int], None]]:
    """The tiny step over ``n`` pre-made batches, and over a DataLoader's first ``n``."""
    torch.manual_seed(0)
    x = torch.randn(_BATCHES * 8, 32)
    y = torch.randint(0, 10, (_BATCHES * 8,))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = list(x.view(_BATCHES, 8, 32)), list(y.view(_BATCHES, 8))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)

    def tensors(n: int) -> None:
        run_loops._train(model, opt, zip(xs[:n], ys[:n], strict=True))

    def loaded(n: int) -> None:
        batches = iter(loader)
        run_loops._train(model, opt, (next(batches) for _ in range(n)))

    return {"step/tensors": tensors, "step/loader": loaded}


def added(loop: Callable[[int], None], steps: int) -> tuple[float, float]:
    """(Python, C) calls a step of ``loop`` under run's hooks, less its plain count."""
    plain = calls_per_step(loop, steps)
    sites = SyncSites([str(Path(__file__).resolve().parent)])
    runner = Steps(lambda device: ThrottleHooks(None, device=device, sample_every=SAMPLE_EVERY,
                                                trace=0, nonfinite=None), sites)
    patches = Patches()
    torchhooks.install(runner, patches)
    sites.start(patches)
    try:
        loop(50)
        hooked = calls_per_step(loop, steps)
    finally:
        runner.finish()
        sites.stop()
        patches.undo()
    return hooked[0] - plain[0], hooked[1] - plain[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    steps = parser.parse_args().steps
    for name, loop in loops().items():
        python, c = added(loop, steps)
        print(f"{name}: +{python:.1f} Python calls, +{c:.1f} C calls a step under run")


if __name__ == "__main__":
    main()
