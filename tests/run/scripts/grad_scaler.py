"""GradScaler: the loss the script computed, not the scaled one, and a step the scaler skips; its
step() reads whether the gradients were finite, a sync each step on an accelerator."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(5)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
losses = []
for it in range(5):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    if it == 2:
        # an Inf in the batch: Inf gradients, so the scaler skips this step's optimizer.step()
        x[0, 0] = float("inf")
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)  # host-device sync: Tensor.item 1.0
    scaler.update()
    losses.append(loss.detach())
print("scale now", scaler.get_scale())  # host-device sync: Tensor.item outside 1
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
