"""Hides every GPU at its top, before importing torch (CUDA_VISIBLE_DEVICES=""): torch must see
none, under run as under python; then trains on the CPU."""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch
from torch import nn

print("cuda", torch.cuda.is_available(), torch.cuda.device_count())
torch.manual_seed(2)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
    opt.zero_grad()
    loss.backward()
    opt.step()
