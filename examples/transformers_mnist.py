"""Train the MNIST example's CNN with Hugging Face's Trainer, throttled by one callback.

    python examples/transformers_mnist.py                          # the advice applied (no per-step
    sync)
    python examples/transformers_mnist.py --detect-sync            # CUDA: count the syncs per step,
    name their sites
    python examples/transformers_mnist.py --detect-sync --nan-inf-filter   # transformers' default:
    2 syncs/micro-batch
    python examples/transformers_mnist.py --detect-sync --blocking-copies  # accelerate's default: a
    sync per copy

``ThrottleCallback`` makes each optimizer step one throttle step (with
``--grad-accum`` micro-batches), keeps at most ``--depth`` of them unfinished on
the device and delivers each step's loss without a sync. ``--nan-inf-filter``
keeps transformers' default ``logging_nan_inf_filter=True``, which checks the
loss on the host every micro-batch, and ``--blocking-copies`` keeps accelerate's
default blocking copy of each micro-batch to the device: compare syncs per step
and steps/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

# for _mnist_common when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mnist_common import Net, add_training_options, load_data, positive, resolve_device, step_cap

try:
    import transformers
except ImportError:
    raise SystemExit(
        "this example needs transformers: pip install 'asyncthrottle[transformers]'"
    ) from None

from asyncthrottle.transformers import ThrottleCallback


class Images(Dataset[dict[str, torch.Tensor]]):
    """(image, label) pairs as the dicts the Trainer's collator expects."""

    def __init__(self, pairs: Dataset[Any]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[index]
        return {"pixel_values": x, "labels": torch.as_tensor(y)}


class Classifier(nn.Module):
    """The CNN, returning ``{"loss", "logits"}`` like a transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, pixel_values: torch.Tensor,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(pixel_values)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p)
    p.add_argument("--grad-accum", type=positive(int, "grad-accum"), default=1,
                   help="micro-batches per step")
    p.add_argument("--detect-sync", action="store_true",
                   help="count the syncs of every step (needs CUDA)")
    p.add_argument("--nan-inf-filter", action="store_true",
                   help="keep transformers' default logging_nan_inf_filter=True (2 syncs per "
                        "micro-batch)")
    p.add_argument("--blocking-copies", action="store_true",
                   help="keep accelerate's default blocking micro-batch copies (CUDA: a sync per "
                        "tensor)")
    return p.parse_args(argv)


def train(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Run the training; returns the per-step losses, the evaluation and the throttle's stats."""
    device = resolve_device(args.device)
    max_steps = step_cap(args, device, log)
    data = load_data(args.data, args.data_dir, args.seed, log=log)
    train_set, test_set = Images(data.train), Images(data.test)
    per_epoch = len(train_set) // (args.batch_size * args.grad_accum)
    total_steps = args.epochs * min(per_epoch, max_steps or per_epoch)
    log(f"device={device} data={data.source} depth={args.depth} "
        f"batch={args.batch_size}x{args.grad_accum} nan_inf_filter={args.nan_inf_filter} "
        f"blocking_copies={args.blocking_copies} detect_sync={args.detect_sync}")

    callback = ThrottleCallback(args.depth, device=device,
                                detect_sync="warn" if args.detect_sync else None)
    losses: list[tuple[int, float]] = []

    @callback.throttle.on_complete
    def record_loss(step: int, values: dict[str, Any]) -> None:
        # a host copy: reading it never syncs
        losses.append((step, float(values["loss"])))

    # copies overlap the device only from pinned memory, non_blocking
    pinned = device.type in ("cuda", "xpu")
    non_blocking = pinned and not args.blocking_copies
    with tempfile.TemporaryDirectory() as out:
        targs = transformers.TrainingArguments(
            output_dir=out,
            use_cpu=device.type == "cpu",
            max_steps=total_steps,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=1000,
            gradient_accumulation_steps=args.grad_accum,
            learning_rate=args.lr,
            optim="sgd",
            lr_scheduler_type="constant",
            eval_strategy="no",
            save_strategy="no",
            report_to=[],
            logging_strategy="no",
            disable_tqdm=args.no_progress,
            dataloader_num_workers=args.workers or 0,
            # copies without a sync
            dataloader_pin_memory=pinned,
            accelerator_config={"non_blocking": non_blocking},
            remove_unused_columns=False,
            seed=args.seed,
            logging_nan_inf_filter=args.nan_inf_filter,
        )
        trainer = transformers.Trainer(model=Classifier(), args=targs, train_dataset=train_set,
                                       eval_dataset=test_set, callbacks=[callback])
        start = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - start
        metrics = trainer.evaluate()
    stats = callback.throttle.stats
    values = [value for _, value in losses]
    log(f"train: {stats.steps} optimizer steps in {elapsed:.1f} s ({stats.steps / elapsed:.1f} "
        f"steps/s), loss {values[0]:.3f} -> {values[-1]:.3f}; eval loss {metrics['eval_loss']:.3f}")
    log(callback.throttle.summary())
    return {
        "losses": losses, "stats": stats, "eval_loss": metrics["eval_loss"], "data": data.source,
        "audit": callback.throttle.sync_audit,
    }


def main(argv: Sequence[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
