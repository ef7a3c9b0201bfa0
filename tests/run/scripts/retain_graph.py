"""Two losses over one forward, the first's backward with retain_graph=True, then one update: 6
batches, 6 steps; a step's loss is both losses'."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(20)
trunk = nn.Sequential(nn.Linear(5, 16), nn.ReLU())
heads = nn.ModuleList([nn.Linear(16, 1), nn.Linear(16, 3)])
opt = torch.optim.Adam([*trunk.parameters(), *heads.parameters()], lr=1e-2)
kept = []
for _ in range(6):
    x, y, c = torch.randn(8, 5), torch.randn(8, 1), torch.randint(0, 3, (8,))
    features = trunk(x)
    regression = nn.functional.mse_loss(heads[0](features), y)
    classes = nn.functional.cross_entropy(heads[1](features), c)
    opt.zero_grad()
    regression.backward(retain_graph=True)
    classes.backward()
    opt.step()
    kept.append(regression.detach() + classes.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
