"""Prints each step's loss into a buffer that the loop reads back, to stop after 5 lines: it
trains 5 steps. ``run --suggest`` must not move that print into a callback, which runs once its
step completes: the buffer would fill a step late, and the loop train 6 steps.
"""

import io

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(10)]
log = io.StringIO()
steps = 0
for x in batches:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"{loss.item():.4f}", file=log)  # host-device sync: Tensor.item 1.0
    steps += 1
    if len(log.getvalue().splitlines()) >= 5:
        break
print("trained", steps, "steps")
