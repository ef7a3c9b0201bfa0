"""A compiled training step with the backward inside it (a graph break there, under python too):
the runner's hooks that the eager backward calls are not compiled, so the graphs, the breaks and
the warnings are python's."""

import json
import sys

import torch
from torch import nn
from torch._dynamo.utils import counters

torch.manual_seed(14)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


@torch.compile(backend="eager")
def train_step(x, y):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.detach()


losses = []
for _ in range(3):
    opt.zero_grad()
    losses.append(train_step(torch.randn(8, 4), torch.randn(8, 1)))
    opt.step()
breaks = sum(counters["graph_break"].values())
print("graphs", counters["stats"]["unique_graphs"], "breaks", breaks)
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
