"""The Python and C calls a training step makes under ``run``'s hooks beyond a plain loop
(#44 point 9): exact counts (``sys.setprofile``), unlike a timing, whatever the machine's load.

In one process: the tiny step of ``run_loops.py`` (a 32-64-10 MLP, SGD, batch 8) over a list of
tensors and over a DataLoader, 400 steps plain, then the same under the runner's hooks and sync
audit, installed as ``run`` installs them (observe only). To count another commit's package:
``git archive COMMIT asyncthrottle | tar -x -C DIR``, then ``PYTHONPATH=DIR python
benchmarks/run_calls.py``.

The floor beside each: hooks at run's four places with run's guards, doing nothing (what
any observer built on torch's hooks adds).

    python benchmarks/run_calls.py [--steps 400]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import run_loops  # (benchmarks/, this script's own folder)
import torch
from _calls import calls_per_step
from torch.utils.data import DataLoader, TensorDataset

from asyncthrottle.audit.patches import Patches
from asyncthrottle.audit.syncsites import SyncSites
from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run import torchhooks
from asyncthrottle.run.record import Record
from asyncthrottle.run.recording import RecordingSteps
from asyncthrottle.run.steps import SAMPLE_EVERY, Steps

_BATCHES = 2000


def loops() -> tuple[dict[str, Callable[[int], None]], torch.optim.Optimizer]:
    """The tiny step over ``n`` pre-made batches, and over a DataLoader's first ``n``; and its
    optimizer."""
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

    return {"step/tensors": tensors, "step/loader": loaded}, opt


def added(loop: Callable[[int], None], optimizer: torch.optim.Optimizer,
          steps: int) -> tuple[float, float]:
    """(Python, C) calls a step of ``loop`` under run's hooks, less its plain count."""
    plain = calls_per_step(loop, steps)
    with run_hooks(optimizer):
        loop(50)
        hooked = calls_per_step(loop, steps)
    return hooked[0] - plain[0], hooked[1] - plain[1]


@contextmanager
def run_hooks(optimizer: torch.optim.Optimizer, *, audit: bool = True,
              make: Callable[[Any], Any] | None = None, record: bool = False) -> Iterator[Steps]:
    """Run's hooks in place while the block runs, installed as ``run`` installs them (observe
    only), with its sync audit unless ``audit`` is False; its record kept whole, as
    ``--events`` keeps it, with ``record``, else grouped as it grows, as every run keeps it;
    ``make(device)`` builds the runner's throttle hooks (default: run's own). ``optimizer``,
    made before the hooks, is told to them as a script's made under run is."""
    sites = SyncSites([str(Path(__file__).resolve().parent)]) if audit else None
    make = make or (lambda device: ThrottleHooks(
        None, device=device, sample_every=SAMPLE_EVERY, trace=0, nonfinite=None))
    runner = RecordingSteps(make, sites, record=Record(), grow=not record)
    runner.optimizers.made(optimizer)
    patches = Patches()
    torchhooks.install(runner, patches)
    if sites is not None:
        sites.start(patches)
    try:
        yield runner
    finally:
        runner.finish()
        if sites is not None:
            sites.stop()
        patches.undo()


def floor(loop: Callable[[int], None], steps: int) -> tuple[float, float]:
    """(Python, C) calls a step of ``loop`` under :func:`floor_hooks`, less its plain count."""
    plain = calls_per_step(loop, steps)
    with floor_hooks():
        hooked = calls_per_step(loop, steps)
    return hooked[0] - plain[0], hooked[1] - plain[1]


PLACES = ("forward", "backward", "optimizer")


@contextmanager
def floor_hooks(places: tuple[str, ...] = PLACES) -> Iterator[None]:
    """The least any hook-based observer adds, in place while the block runs: hooks at run's four
    places (the armed global forward pre-hook, ``torch.autograd.backward``, the optimizer's pre
    and post hooks), with run's guards (not compiling, the loop's thread), doing nothing but arm
    and disarm the forward hook. ``places``: some of them only (``"forward"``: the forward hook,
    re-armed by an optimizer post hook; ``"backward"``; ``"optimizer"``: the pre and post
    hooks)."""
    from threading import get_ident

    from torch.nn.modules import module
    from torch.optim import optimizer

    compiling, thread = torch.compiler.is_compiling, get_ident()
    forward_hooks = module._global_forward_pre_hooks

    def hook(mod: object, args: object) -> None:
        if not compiling() and get_ident() == thread:
            forward_hooks.pop(key, None)

    def before(opt: object, args: object, kwargs: object) -> None:
        if not compiling() and get_ident() == thread:
            pass

    def after(opt: object, args: object, kwargs: object) -> None:
        if not compiling() and get_ident() == thread and "forward" in places:
            forward_hooks[key] = hook

    # the key a handle would take, as run's hook keeps it
    handle = module.register_module_forward_pre_hook(hook)
    handle.remove()
    key = handle.id
    original = torch.autograd.backward

    def backward(tensors: object, *args: object, **kwargs: object) -> object:
        if get_ident() == thread:
            pass
        return original(tensors, *args, **kwargs)  # type: ignore[arg-type]

    def rearm(opt: object, args: object, kwargs: object) -> None:
        forward_hooks[key] = hook

    handles = []
    if "optimizer" in places:
        handles = [optimizer.register_optimizer_step_pre_hook(before),
                   optimizer.register_optimizer_step_post_hook(after)]
    elif "forward" in places:
        handles = [optimizer.register_optimizer_step_post_hook(rearm)]
    if "backward" in places:
        torch.autograd.backward = backward  # type: ignore[assignment]
    if "forward" in places:
        forward_hooks[key] = hook
    try:
        yield
    finally:
        for made in handles:
            made.remove()
        torch.autograd.backward = original
        forward_hooks.pop(key, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    steps = parser.parse_args().steps
    made, optimizer = loops()
    for name, loop in made.items():
        python, c = added(loop, optimizer, steps)
        least, least_c = floor(loop, steps)
        print(f"{name}: +{python:.1f} Python calls, +{c:.1f} C calls a step under run "
              f"(the floor of hooks at its places that do nothing: +{least:.1f}, +{least_c:.1f})")


if __name__ == "__main__":
    main()
