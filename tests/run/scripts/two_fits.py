"""Two Lightning Trainer.fit() calls, 5 steps then 3 (a pretraining, then a fine-tuning): one run
of 8 steps, every loss heard."""

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
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.linear(x), y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(model, steps):
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4))


torch.manual_seed(10)
data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
model = Tiny()
fit(model, 5)
fit(model, 3)
print("trained", len(model.losses), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(model.losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
