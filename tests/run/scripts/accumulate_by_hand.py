"""Gradient accumulation by hand, over micro-batches the loop makes itself (no DataLoader): 4
backward() calls of a quarter of the loss, then one update: 6 updates, 6 steps; a step's loss is
its 4 backward() calls'."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(22)
model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
MICRO = 4
kept = []
for _ in range(6):
    step_loss = None
    for _ in range(MICRO):
        x, y = torch.randn(4, 3), torch.randn(4, 1)
        loss = nn.functional.mse_loss(model(x), y) / MICRO
        loss.backward()
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    opt.step()
    opt.zero_grad()
    kept.append(step_loss)
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
