"""SAM over a DataLoader: each batch a forward and backward at the weights, the weights moved in
place under no_grad, a second forward and backward there, the weights put back, one step(): 16
batches, 16 steps; a step's loss is both passes' (what its backward() calls differentiate)."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(11)
loader = DataLoader(TensorDataset(torch.randn(64, 6), torch.randn(64, 1)), batch_size=4)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
RHO = 0.05
kept = []
for x, y in loader:
    first = nn.functional.mse_loss(model(x), y)
    first.backward()
    with torch.no_grad():
        norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        moved = [RHO * p.grad / (norm + 1e-12) for p in model.parameters()]
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
