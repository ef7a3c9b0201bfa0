"""An instant loader and 2 ms of preprocessing in the loop body before the forward, with a
read of the batch every step before its forward: the body's work is the step's, not input wait."""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(7)
data = TensorDataset(torch.randn(48, 6), torch.randint(1, 6, (48,)), torch.randn(48, 1))
loader = DataLoader(data, batch_size=4)
model = nn.Linear(6, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for x, lengths, y in loader:
    width = int(lengths.max())  # host-device sync: Tensor.__int__ 1.0
    # the "preprocessing": 2 ms of host work that is the loop's own
    until = time.perf_counter() + 0.002
    while time.perf_counter() < until:
        pass
    x = x * (width / 6)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
