"""Reads its loss on the host every step (``loss.item()``, a sync on an accelerator), then its
mean loss once after the loop. ``item_removed.py`` is this script with that line removed: the
same seed, so the same losses, and the mean's line one line up (``compare`` says ``moved?``)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
data = TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    print(f"loss {loss.item():.4f}")  # host-device sync: Tensor.item 1.0
print(f"mean loss {float(torch.stack(losses).mean()):.4f}")  # host-device sync: Tensor.__float__ outside 1
