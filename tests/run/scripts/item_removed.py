"""``item_every_step.py`` with its ``loss.item()`` line removed: no read of the loss in its
steps, the same seed and so the same losses, and the mean's read after the loop one line up
(``compare`` says ``moved?`` where both ran as one file name)."""

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
print(f"mean loss {float(torch.stack(losses).mean()):.4f}")  # host-device sync: Tensor.__float__ outside 1
