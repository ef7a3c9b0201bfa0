"""A new optimizer each epoch over the same parameters (the learning rate reset each epoch): one
optimizer's series, 12 steps."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(3)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
kept = []
for epoch in range(3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 / (epoch + 1))
    for _ in range(4):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
        loss.backward()
        optimizer.step()
        kept.append(loss.detach())
print("epochs", 3, "steps", len(kept))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
