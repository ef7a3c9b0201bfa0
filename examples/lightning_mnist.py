"""Train the MNIST example's CNN with Lightning, throttled by one callback, with a progress bar that
never syncs.

    python examples/lightning_mnist.py                        # auto-detects the device and the data
    python examples/lightning_mnist.py --depth 1 --max-steps 100
    python examples/lightning_mnist.py --detect-sync          # CUDA: count the syncs per step, name
    their sites
    python examples/lightning_mnist.py --detect-sync --prog-bar-log   # the common setup, without
    the advice

``ThrottleCallback`` keeps at most ``--depth`` training steps unfinished on the
device and defers each step's loss (no ``.item()``); ``ThrottleProgressBar``
shows it without reading ``trainer.progress_bar_metrics``. ``--prog-bar-log``
instead logs the loss with ``self.log(..., prog_bar=True)`` under Lightning's
default bar, which ``.item()``-s it every step: compare the syncs per step
and steps/s that ``--detect-sync`` reports in the summary.
"""

from __future__ import annotations

import argparse
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
    load_data,
    loader_options,
    resolve_device,
    step_cap,
)

try:
    import lightning.pytorch as L
except ImportError:
    raise SystemExit(
        "this example needs Lightning: pip install 'asyncthrottle[lightning]'"
    ) from None

from asyncthrottle.lightning import ThrottleCallback, ThrottleProgressBar


class LitNet(L.LightningModule):
    """The example's CNN as a LightningModule; test accuracy is counted on the device, read once per
    evaluation."""

    def __init__(self, lr: float, prog_bar_log: bool) -> None:
        super().__init__()
        self.net, self.lr, self.prog_bar_log = Net(), lr, prog_bar_log
        self.correct: torch.Tensor | None = None
        self.total = 0
        self.accuracies: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        # the common setup: Lightning .item()s this every step (see docs/frameworks.md)
        if self.prog_bar_log:
            self.log("train_loss", loss, prog_bar=True)
        # the ThrottleCallback defers it: no .item() here
        return loss

    def on_validation_epoch_start(self) -> None:
        self.correct, self.total = torch.zeros((), dtype=torch.int64, device=self.device), 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        assert self.correct is not None
        self.correct += (self.net(x).argmax(1) == y).sum()
        self.total += len(y)

    def on_validation_epoch_end(self) -> None:
        assert self.correct is not None
        self.accuracies.append(
            int(self.correct.item()) / max(self.total, 1)
        )  # host-device sync: once per evaluation

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p)
    p.add_argument("--detect-sync", action="store_true",
                   help="count the syncs of every step and name their sites (needs CUDA)")
    p.add_argument("--prog-bar-log", action="store_true",
                   help="log the loss with prog_bar=True under Lightning's default bar (syncs "
                        "every step)")
    return p.parse_args(argv)


def train(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Run the training; returns the per-step losses, per-epoch accuracies and the throttle's
    stats."""
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    max_steps = step_cap(args, device, log)
    data = load_data(args.data, args.data_dir, args.seed, log=log)
    options = loader_options(args, device)
    workers = options["num_workers"]
    train_loader = DataLoader(data.train, shuffle=True, drop_last=True, **options)
    test_loader = DataLoader(data.test, **{**options, "batch_size": 1000})
    log(f"device={device} data={data.source} depth={args.depth} batch={args.batch_size} "
        f"workers={workers} prog_bar_log={args.prog_bar_log} detect_sync={args.detect_sync}")

    callback = ThrottleCallback(args.depth, device=device,
                                detect_sync="warn" if args.detect_sync else None)
    losses: list[tuple[int, float]] = []

    @callback.throttle.on_complete
    def record_loss(step: int, values: dict[str, Any]) -> None:
        # a host copy: reading it never syncs
        losses.append((step, float(values["loss"])))

    callbacks: list[Any] = [callback]
    if not args.no_progress and not args.prog_bar_log:
        callbacks.append(ThrottleProgressBar())
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator=device.type,
        devices=[device.index or 0] if device.type != "cpu" else 1,
        limit_train_batches=max_steps or 1.0,
        callbacks=callbacks,
        enable_progress_bar=not args.no_progress,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = LitNet(args.lr, args.prog_bar_log)
    start = time.perf_counter()
    trainer.fit(model, train_loader, test_loader)
    elapsed = time.perf_counter() - start
    steps = len(losses) // max(args.epochs, 1)
    for epoch, accuracy in enumerate(model.accuracies, start=1):
        values = [value for _, value in losses[(epoch - 1) * steps: epoch * steps]]
        log(f"epoch {epoch}: {steps} steps, train loss {values[0]:.3f} -> {values[-1]:.3f}, "
            f"test accuracy {accuracy:.1%}")
    stats = callback.throttle.stats
    log(f"fit: {stats.steps} steps in {elapsed:.1f} s ({stats.steps / elapsed:.1f} steps/s "
        "including validation)")
    log(callback.throttle.summary())
    return {"losses": losses, "accuracies": model.accuracies, "stats": stats, "data": data.source,
            "audit": callback.throttle.sync_audit}


def main(argv: Sequence[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
