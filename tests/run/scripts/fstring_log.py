"""Prints the epoch, the step and the loss tensor in one f-string every step: the one read is
the loss's (the two ints are none), and the suggestion names it alone."""

import torch
from torch import nn

torch.manual_seed(6)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for i in range(3):
        loss = nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {i} loss {loss:.4f}")  # host-device sync: Tensor.__format__ 1.0
