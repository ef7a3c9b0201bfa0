"""Gradient accumulation: two backward() calls make one optimizer step, and so one step."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(1)
loader = DataLoader(TensorDataset(torch.randn(32, 3), torch.randn(32, 1)), batch_size=4)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
ACCUMULATE = 2
losses, step_loss = [], None
for k, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y) / ACCUMULATE
    loss.backward()
    step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if (k + 1) % ACCUMULATE == 0:
        opt.step()
        opt.zero_grad()
        losses.append(step_loss)
        step_loss = None
print("trained", len(losses), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
