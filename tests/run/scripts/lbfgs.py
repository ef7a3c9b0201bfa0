"""optimizer.step(closure): LBFGS evaluates the closure several times in one step, and reads the
loss and its gradients on the host inside step() (torch's own reads of device values)."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(4)
x = torch.randn(20, 2)
y = x @ torch.tensor([[1.5], [-0.5]])
model = nn.Linear(2, 1)
opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)


def closure():
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


losses = []
for _ in range(3):
    # LBFGS reads the loss and branches on its gradients inside step(): syncs on an accelerator
    losses.append(opt.step(closure).detach())  # host-device sync: Tensor.__bool__ 15.0; host-device sync: Tensor.__float__ 4.0  # noqa: E501
print("steps", len(losses))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
