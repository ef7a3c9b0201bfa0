"""Lightning's Trainer.fit on a tiny LightningModule: 2 epochs of 3 steps, a validation loop after
each, the CPU.

``python lightning_fit.py OUT [--own]``: OUT gets the losses training_step returned and the
callbacks fit ran with; ``--own`` adds asyncthrottle's callback itself."""

import json
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.linear(x), y)
        if not torch.isfinite(loss):  # host-device sync: Tensor.__bool__ 1.0
            raise RuntimeError(f"step {batch_idx}: the loss is not finite")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.linear(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Records(L.Callback):
    """Each training batch's loss (one optimizer step each) and the callbacks of the fit."""

    def __init__(self):
        self.losses, self.callbacks = [], []

    def on_train_start(self, trainer, pl_module):
        self.callbacks = [type(c).__name__ for c in trainer.callbacks]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].detach())


torch.manual_seed(4)
train = DataLoader(TensorDataset(torch.randn(12, 3), torch.randn(12, 1)), batch_size=4)
val = DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=4)
records = Records()
callbacks = [records]
if "--own" in sys.argv:
    from asyncthrottle.lightning import ThrottleCallback

    callbacks.append(ThrottleCallback(depth=2))
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks)
trainer.fit(Tiny(), train, val)
print("trained", len(records.losses), "steps")
with open(sys.argv[1], "w") as file:
    losses = torch.stack(records.losses).tolist()  # host-device sync: Tensor.tolist outside 1
    json.dump({"losses": losses, "callbacks": records.callbacks}, file)
