"""Child of test_lightning_sigterm.py: real Lightning DDP (cpu, gloo, 2 ranks), a ThrottleCallback per fit.

Usage: python _lightning_sigterm_worker.py OUT NAME:EVERY:SIGNAL_RANK:DEVICE[,...]; Lightning re-runs the command
for rank 1, and later Trainers reuse the process group. DEVICE is the throttle's: "cpu" (synchronous) or "fake" (an
asynchronous fake device's events). Each rank appends a JSON line per scenario to OUT.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import warnings
from typing import Any

STEPS = 30
KILL_AT = 10  # the signalled rank sends itself SIGTERM at this batch's end


def fit_once(out: str, name: str, every: int | None, signal_rank: int, device: str) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    import asyncthrottle.lightning as atl
    from asyncthrottle.testing import FakeDevice

    torch.set_num_threads(1)
    record: dict[str, Any] = {"name": name, "items": 0, "all_items": 0, "batches": 0, "exc": None, "advice": []}
    real_item = torch.Tensor.item
    counting = [False]

    def item(self: torch.Tensor) -> Any:
        if counting[0]:
            record["all_items"] += 1
            if sys._getframe(1).f_code.co_name in ("_broadcast_sigterm_tensor", "exchange"):  # Lightning's, ours
                record["items"] += 1
        return real_item(self)

    class Probe(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            record["rank"] = trainer.global_rank
            counting[0] = True

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            record["batches"] = batch_idx + 1
            if trainer.global_rank == signal_rank and batch_idx == KILL_AT:
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            counting[0] = False

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            counting[0] = False
            record["exc"] = type(exception).__name__

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.Tensor.item = item  # type: ignore[method-assign]
    data = torch.utils.data.DataLoader(torch.randn(STEPS * 4 * 2, 8), batch_size=4)
    if device == "fake":
        dev = FakeDevice()
        cb = atl.ThrottleCallback(2, events=dev.event, wait=dev.wait("poll"), clock=dev.clock, sigterm_every=every)
    else:
        cb = atl.ThrottleCallback(2, device=device, sigterm_every=every)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=STEPS, max_epochs=1, logger=False, enable_checkpointing=False,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(seconds=60)),
        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb, Probe()], num_sanity_val_steps=0,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(Tiny(), data)
        except BaseException as exc:  # SIGTERMException is a SystemExit
            record["exc"] = record["exc"] or type(exc).__name__
        finally:
            torch.Tensor.item = real_item  # type: ignore[method-assign]
    record["advice"] = [str(w.message) for w in caught if "SIGTERM" in str(w.message)]
    record["advice_at"] = [w.filename for w in caught if "SIGTERM" in str(w.message)]
    record["sections"] = cb.throttle.stats.sections
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    out, specs = sys.argv[1], sys.argv[2]
    for spec in specs.split(","):
        name, every, signal_rank, device = spec.split(":")
        fit_once(out, name, int(every) or None, int(signal_rank), device)
