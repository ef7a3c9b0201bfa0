"""Loops that time themselves, for ``run_cost.py``: a tiny training step and evaluation forwards.

A plain PyTorch program with no asyncthrottle in it, run as ``python run_loops.py ...`` and as
``python -m asyncthrottle run run_loops.py ...``. Only the loops are timed (``time.perf_counter``
for wall time, ``time.process_time`` for the process's CPU time), never the start-up or the
imports; no loop reads a device value on the host. Its last line on stdout is ``run_loops:``
and a JSON object: ``steps``, the training steps it made in all, and ``times``: for each loop,
one ``[wall_us, cpu_us]`` pair per repeat, per step (training) or per batch (evaluation).

    python benchmarks/run_loops.py PARTS STEPS BATCHES REPEATS

PARTS: ``step``, ``eval`` or ``step,eval``; STEPS: training steps per timed loop; BATCHES:
evaluation batches per timed loop; REPEATS: timed loops of each kind, interleaved, after one
untimed warm-up of each.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# the tiny step: a batch of 8 through a 32-64-10 MLP, SGD
_BATCH, _WIDTH, _HIDDEN, _CLASSES = 8, 32, 64, 10
# the evaluation model: this many Linear+ReLU pairs (41 submodules with the Sequential)
_LAYERS = 20
# training steps before the evaluation forwards, so that they come after a training loop
_TRAIN_FIRST = 20

Loop = Callable[[], int]


def _timed(loop: Loop) -> list[float]:
    """[wall µs, CPU µs] per item of one run of ``loop`` (which returns its item count)."""
    wall, cpu = time.perf_counter(), time.process_time()
    items = loop()
    return [(time.perf_counter() - wall) * 1e6 / items, (time.process_time() - cpu) * 1e6 / items]


def _train(model: nn.Module, opt: torch.optim.Optimizer,
           batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> int:
    """The training loop a user writes, with no host read in it; returns its step count."""
    steps = 0
    for xb, yb in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        steps += 1
    return steps


def step_loops(steps: int) -> dict[str, Loop]:
    """The tiny training step over pre-made tensors (``for`` over a list) and over a DataLoader."""
    torch.manual_seed(0)
    x, y = torch.randn(steps * _BATCH, _WIDTH), torch.randint(0, _CLASSES, (steps * _BATCH,))
    xs, ys = list(x.view(steps, _BATCH, _WIDTH)), list(y.view(steps, _BATCH))
    loader = DataLoader(TensorDataset(x, y), batch_size=_BATCH, shuffle=False)
    model = nn.Sequential(nn.Linear(_WIDTH, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return {"step/tensors": lambda: _train(model, opt, zip(xs, ys, strict=True)),
            "step/loader": lambda: _train(model, opt, loader)}


def _forwards(model: nn.Module, batches: list[torch.Tensor], train: bool,
              mode: Callable[[], AbstractContextManager[object]]) -> Loop:
    def loop() -> int:
        model.train(train)
        with mode():
            for xb in batches:
                model(xb)
        return len(batches)

    return loop


def eval_loops(batches: int) -> dict[str, Loop]:
    """Forwards of a model of many small submodules, after a few training steps: ``eval()``
    + ``no_grad``, ``eval()`` + ``inference_mode``, and ``no_grad`` alone (in train mode)."""
    torch.manual_seed(1)
    layers = [m for _ in range(_LAYERS) for m in (nn.Linear(_WIDTH, _WIDTH), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(_WIDTH, _CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(_TRAIN_FIRST, 16, _WIDTH), torch.randint(0, _CLASSES, (_TRAIN_FIRST, 16))
    _train(model, opt, zip(x, y, strict=True))
    data = list(torch.randn(batches, 16, _WIDTH))
    return {"eval/eval+no_grad": _forwards(model, data, False, torch.no_grad),
            "eval/eval+inference_mode": _forwards(model, data, False, torch.inference_mode),
            "eval/no_grad": _forwards(model, data, True, torch.no_grad)}


def measure(loops: dict[str, Loop], repeats: int) -> dict[str, list[list[float]]]:
    """Each loop once untimed, then ``repeats`` timed rounds, alternating the order of the loops."""
    for loop in loops.values():
        loop()
    times: dict[str, list[list[float]]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(_timed(loops[name]))
    return times


def main(argv: list[str]) -> int:
    parts, steps, batches, repeats = argv[0].split(","), int(argv[1]), int(argv[2]), int(argv[3])
    times: dict[str, list[list[float]]] = {}
    trained = 0
    if "step" in parts:
        times.update(measure(step_loops(steps), repeats))
        trained += 2 * (repeats + 1) * steps
    if "eval" in parts:
        times.update(measure(eval_loops(batches), repeats))
        trained += _TRAIN_FIRST
    print("run_loops: " + json.dumps({"steps": trained, "times": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
