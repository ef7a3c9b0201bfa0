"""Two tasks trained in turn over batches the loop makes itself (no DataLoader): each step's
forward is at its task's own line, and the model spends 3 ms in it. Each of the 8 steps begins at
its forward, wherever that is."""

import json
import sys
import time

import torch
from torch import nn

torch.manual_seed(5)


class Slow(nn.Module):
    """A bigger model's forward: 3 ms of the step's host time."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 8)
        self.heads = nn.ModuleList([nn.Linear(8, 4), nn.Linear(8, 2)])

    def forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        until = time.perf_counter() + 0.003
        while time.perf_counter() < until:
            pass
        return self.heads[task](self.body(x).relu())


model = Slow()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(8):
    x = torch.randn(16, 16)
    if step % 2 == 0:
        loss = nn.functional.cross_entropy(model(x, 0), torch.randint(0, 4, (16,)))
    else:
        loss = nn.functional.mse_loss(model(x, 1), torch.zeros(16, 2))
    opt.zero_grad()
    loss.backward()
    opt.step()
    kept.append(loss.detach())
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
