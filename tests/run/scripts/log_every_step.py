"""Logs its loss every step in the usual ways, each a host read: an f-string print with the epoch
and the step, a logger line with a global step counter (to stdout too), a list of the losses and a
running total printed after each epoch, and a NaN check that raises. ``run --suggest`` moves the
list, the total and the check with certainty; the print and the logger's line stay advice (a
record moved would name another line, and the print would come after the logger's line).
``sys.argv[1]``: the global step whose loss is made NaN (default: none).
"""

import logging
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
logger = logging.getLogger("train")
torch.manual_seed(3)
nan_at = int(sys.argv[1]) if len(sys.argv) > 1 else -1
data = TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
for epoch in range(2):
    losses = []
    total = 0.0
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        if step == nan_at:
            loss = loss + float("nan")
        if not torch.isfinite(loss):  # host-device sync: Tensor.__bool__ 1.0
            raise RuntimeError(f"the loss is {loss} at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {i} loss {loss.item():.4f}")  # host-device sync: Tensor.item 1.0
        logger.info("step %d: %.6f", step, loss.item())  # host-device sync: Tensor.item 1.0
        losses.append(loss.item())  # host-device sync: Tensor.item 1.0
        total += float(loss.detach())  # host-device sync: Tensor.__float__ 1.0
        step += 1
    print(f"epoch {epoch}: mean {sum(losses) / len(losses):.6f}, total {total:.6f}")
