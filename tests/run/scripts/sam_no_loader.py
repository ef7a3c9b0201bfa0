"""SAM over batches the loop makes itself (no DataLoader): two forward and backward passes a
batch, the weights moved in place under no_grad between them, one step(): 12 steps."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(12)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
RHO = 0.05
kept = []
for _ in range(12):
    x, y = torch.randn(4, 6), torch.randn(4, 1)
    first = nn.functional.mse_loss(model(x), y)
    first.backward()
    with torch.no_grad():
        moved = [RHO * p.grad / (p.grad.norm() + 1e-12) for p in model.parameters()]
        for p, e in zip(model.parameters(), moved, strict=True):
            p.add_(e)
    opt.zero_grad()
    second = nn.functional.mse_loss(model(x), y)
    second.backward()
    with torch.no_grad():
        for p, e in zip(model.parameters(), moved, strict=True):
            p.sub_(e)
    opt.step()
    opt.zero_grad()
    kept.append(first.detach() + second.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
