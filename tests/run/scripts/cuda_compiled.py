"""On CUDA: a model compiled with fullgraph=True (torch.compile's default backend), trained and
evaluated; its graphs and breaks printed, its losses written to ARGV[1]. Only the loss list is
read on the host, after the loop."""

import json
import sys

import torch
from torch import nn
from torch._dynamo.utils import counters

torch.manual_seed(11)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
model.compile(fullgraph=True)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for _ in range(12):
    x, y = torch.randn(32, 64, device="cuda"), torch.randn(32, 1, device="cuda")
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
model.eval()
with torch.no_grad():
    model(torch.randn(32, 64, device="cuda"))
print("graphs", counters["stats"]["unique_graphs"], "breaks", sum(counters["graph_break"].values()))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
