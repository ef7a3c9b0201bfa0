"""A loop without a DataLoader: a get_batch() function, and a branch on the loss every step."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(2)
model = nn.Linear(5, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def get_batch():
    x = torch.randn(8, 5)
    return x, x[:, :2] * 2.0


losses = []
for _ in range(6):
    x, y = get_batch()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    if loss > 100:  # host-device sync: Tensor.__bool__ 1.0
        print("diverged")
print("done")
with open(sys.argv[1], "w") as out:
    json.dump([float(v) for v in losses], out)  # host-device sync: Tensor.__float__ outside 6
