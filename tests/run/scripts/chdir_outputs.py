"""Changes its working directory, then trains two steps."""

import os
import sys

import torch

os.chdir(sys.argv[1])
w = torch.zeros(2, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(2):
    opt.zero_grad()
    (w - 1).pow(2).sum().backward()
    opt.step()
print(os.path.basename(os.getcwd()))
