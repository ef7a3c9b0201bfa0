"""On CUDA, over a DataLoader: ``loss.item()`` every step when ARGV[2] is "item", else no read in
the loop (the losses kept on the device, read once after it). The losses go to ARGV[1]."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
loader = DataLoader(TensorDataset(torch.randn(480, 256), torch.randn(480, 1)), batch_size=16,
                    pin_memory=True)
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
read = sys.argv[2] == "item"
losses = []
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    if read:
        print(f"loss {loss.item():.4f}")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)
