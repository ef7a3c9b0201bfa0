"""A DataLoader loop, and an evaluation every 3 steps with grad on and no model.eval(): the
evaluation's forward and its read are not steps; the read before each step's forward is."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(9)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
held = torch.randn(16, 4), torch.randn(16, 1)

loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=8)

losses = []
for step, (x, y) in enumerate(loader):
    scale = float(y.abs().max())  # host-device sync: Tensor.__float__ 1.0
    loss = nn.functional.mse_loss(model(x), y / scale)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    if step % 3 == 2:
        val = nn.functional.mse_loss(model(held[0]), held[1])
        print(f"val {val.item():.4f}")  # host-device sync: Tensor.item outside 2
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
