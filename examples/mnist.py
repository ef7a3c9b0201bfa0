"""Train a small CNN on MNIST with asyncthrottle around the DataLoader.

    python examples/mnist.py                     # auto-detects the device and the data
    python examples/mnist.py --depth 1           # the seed's advice: sync once per minibatch
    python examples/mnist.py --depth none        # no throttling (tracking only)
    python examples/mnist.py --depth auto        # start at 2, go deeper when the device runs dry
    python examples/mnist.py --data synthetic --max-steps 100
    python examples/mnist.py --item-every-step   # compare: a .item() sync every step
    python examples/mnist.py --width 32 --batch-size 256   # device-bound on a large GPU:
                                                 # see what depth does
    python examples/mnist.py --trace trace.json  # then: python -m asyncthrottle plot trace.json

The loss is logged every step without a single ``.item()`` in the loop:
``thr.defer(loss)`` copies it to the host without blocking, and the value is
read once its step has completed on the device (``on_complete`` and the
progress bar). The only host-device syncs are the throttle's own waits, which
keep at most ``--depth`` minibatches in flight, and one read per evaluation.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

# for _mnist_common when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mnist_common import (
    Net,
    add_training_options,
    evaluate,
    load_data,
    positive,
    resolve_device,
    step_cap,
)
from _mnist_common import loader_options as make_loader_options

import asyncthrottle as at

# --trace keeps the timeline of this many recent steps
TRACE_STEPS = 10_000


# the synthetic training set's least size (an epoch of 512 steps of 32)
SYNTHETIC_TRAIN = 16384


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p)
    p.add_argument("--width", type=positive(int, "width"), default=1,
                   help="multiply the CNN's channels (default 1, ~25k parameters); 32 with "
                   "--batch-size 256 makes each step ~1.4 TFLOP, so a large GPU is the bottleneck "
                   "instead of Python")
    p.add_argument("--item-every-step", action="store_true",
                   help="also call loss.item() every step: a host-device sync per step, for "
                        "comparison")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write a timeline of the last 10,000 steps (Chrome trace JSON: "
                   "ui.perfetto.dev, chrome://tracing, or python -m asyncthrottle plot FILE)")
    return p.parse_args(argv)


def train(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Run the training; returns the per-step losses, per-epoch accuracies and the throttle's
    stats."""
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    max_steps = step_cap(args, device, log)
    # synthetic data: enough for --max-steps steps of a batch each (SYNTHETIC_TRAIN at least)
    enough = max(SYNTHETIC_TRAIN, (max_steps or 0) * args.batch_size)
    data = load_data(args.data, args.data_dir, args.seed, log=log, train_size=enough)
    loader_options = make_loader_options(args, device)
    workers = loader_options["num_workers"]
    # wrap(..., to=device) below copies each training batch one step ahead through the throttle's
    # own ring of pinned buffers (a plain .to() on the CPU), so this loader need not pin
    train_loader = DataLoader(data.train, shuffle=True, drop_last=True,
                              **{**loader_options, "pin_memory": False})
    test_loader = DataLoader(data.test, **{**loader_options, "batch_size": 1000})
    log(f"device={device} data={data.source} depth={args.depth} batch={args.batch_size} "
        f"width={args.width} workers={workers}")

    model = Net(args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    thr = at.Throttle(args.depth, device=device, trace=TRACE_STEPS if args.trace else 0)
    losses: list[tuple[int, float]] = []

    @thr.on_complete
    def record_loss(step: int, values: dict[str, Any]) -> None:
        # a host copy: reading it never syncs
        losses.append((step, float(values["loss"])))

    accuracies = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        steps = len(train_loader) if max_steps is None else min(max_steps, len(train_loader))
        batches = itertools.islice(train_loader, steps)
        progress = (
            False
            if args.no_progress
            else {"total": steps, "desc": f"epoch {epoch}", "leave": False}
        )
        # waits when more than --depth steps are unfinished
        for x, y in thr.wrap(batches, progress=progress, to=device):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            # no .item(): read when this step completes
            thr.defer(loss.detach(), name="loss")
            if args.item_every_step:
                loss.item()  # host-device sync: what the flag measures, the habit to avoid
        # the wrapper drained at the end of the pass (a sync on the last step): all losses are in
        epoch_losses = [value for _, value in losses[-steps:]]
        correct, total = evaluate(model, test_loader, device, args.depth)
        accuracies.append(correct / total)
        log(
            f"epoch {epoch}: {steps} steps in {time.perf_counter() - start:.1f} s, train loss "
            f"{epoch_losses[0]:.3f} -> {epoch_losses[-1]:.3f} (mean "
            f"{sum(epoch_losses) / steps:.3f}), test accuracy {correct}/{total} = "
            f"{correct / total:.1%}"
        )
    log(thr.summary())
    if args.trace:
        thr.export_trace(args.trace)
        log(f"trace written to {args.trace}: open it in https://ui.perfetto.dev or "
            f"chrome://tracing, or draw it with python -m asyncthrottle plot {args.trace} -o "
            "timeline.png")
    # the pinned memory of queued batches: what the depth bounds on the host
    if device.type == "cuda":
        from asyncthrottle.backends.pinned import bytes_trusted, pinned_in_use

        peak = pinned_in_use(torch.cuda.host_memory_stats(), "peak",
                             trust_bytes=bytes_trusted(torch.__version__))
        log(f"peak pinned host memory in use: {peak / 2**20:.1f} MiB; device memory peak allocated "
            f"{torch.cuda.max_memory_allocated(device) / 2**20:.1f} MiB")
    return {"losses": losses, "accuracies": accuracies, "stats": thr.stats, "data": data.source}


def main(argv: Sequence[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
