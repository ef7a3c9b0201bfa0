"""A model compiled with fullgraph=True, trained and evaluated: the same graphs (and no graph
break) under run as under python. ``compiled.py OUT [cuda]``: on the CPU with the eager backend,
or on CUDA with torch.compile's default (inductor)."""

import json
import sys

import torch
from torch import nn
from torch._dynamo.utils import counters

cuda = sys.argv[2:] == ["cuda"]
device = "cuda" if cuda else "cpu"
torch.manual_seed(11)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
model.compile(fullgraph=True, **({} if cuda else {"backend": "eager"}))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for _ in range(4):
    x, y = torch.randn(8, 4, device=device), torch.randn(8, 1, device=device)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    model(torch.randn(8, 4, device=device))
print("graphs", counters["stats"]["unique_graphs"], "breaks", sum(counters["graph_break"].values()))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
