"""Trains 4 steps reading ``loss.item()`` every step, then ends by ``os._exit(CODE)`` (``CODE``:
its first argument, 0 by default), as a launcher's worker or a script that skips the
interpreter's teardown ends: the process dies at once, its ``atexit`` handler and its ``finally``
never run. A DataLoader with a worker process (forked: it ends by ``os._exit`` too, in another
process) feeds it."""

import atexit
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

atexit.register(print, "atexit ran", file=sys.stderr)
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, num_workers=1, multiprocessing_context="fork")
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item():.4f}", flush=True)  # host-device sync: Tensor.item 1.0
    os._exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
finally:
    print("finally ran", file=sys.stderr)
