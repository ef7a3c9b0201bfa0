"""A DataLoader loop whose loss is NaN at two steps (a bad batch: a NaN constant added to the loss,
so the gradients and the weights stay finite), which reads its loss every step (``loss.item()``)
and its validation loss after the loop: NaN marks and sync sites in and outside steps, for the
HTML report (``docs/img/run-report.png``). The steps of the bad batches: ``sys.argv[1]``
(comma-separated; default 37,38)."""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
bad = {int(step) for step in (sys.argv[1] if len(sys.argv) > 1 else "37,38").split(",")}
x_all = torch.randn(1280, 8)
y_all = x_all @ torch.randn(8, 1) / 3 + 0.1 * torch.randn(1280, 1)
loader = DataLoader(TensorDataset(x_all, y_all), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.02)
logged = []
step = 0
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    if step in bad:
        loss = loss + torch.tensor(float("nan"))  # a NaN loss; its gradient stays finite
    opt.zero_grad()
    loss.backward()
    opt.step()
    logged.append(loss.item())
    step += 1
with torch.no_grad():
    val = nn.functional.mse_loss(model(x_all), y_all)
val = float(val)
print(f"{step} steps, last loss {logged[-1]:.4f}, validation {val:.4f}")
