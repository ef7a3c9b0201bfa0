"""A DataLoader loop with an optimizer, and an evaluation after each epoch (not steps)."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
train = DataLoader(data, batch_size=6)
val = DataLoader(data, batch_size=12)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for epoch in range(2):
    model.train()
    for x, y in train:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        print(f"loss {loss.item():.6f}")  # host-device sync: Tensor.item 1.0
    model.eval()
    with torch.no_grad():
        total = sum(nn.functional.mse_loss(model(x), y) for x, y in val)
    print(f"epoch {epoch} val {float(total):.6f}")  # host-device sync: Tensor.__float__ outside 2
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
