"""A dataset whose transform is an nn.Module, read in the loop's thread (num_workers=0), and a
metric logger's smoothed median: the loader's work is input wait, not a forward of the script's,
and neither it nor the logger reads a device value; the loop's loss.item() does."""

import json
import sys
from collections import deque

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Normalize(nn.Module):
    def forward(self, x):
        if x.abs().max() > 100:  # stays on the host: a dataset's read
            x = x.clamp(-100, 100)
        return (x - x.mean()) / (x.std() + 1e-6)


class Noise(Dataset):
    def __init__(self):
        self.transform = Normalize()
        self.x, self.y = torch.randn(48, 6), torch.randn(48, 1)

    def __len__(self):
        return 48

    def __getitem__(self, k):
        return self.transform(self.x[k]), self.y[k]


class Smoothed:
    def __init__(self):
        self.deque = deque(maxlen=10)

    def update(self, value):
        self.deque.append(value)

    @property
    def median(self):
        d = torch.tensor(list(self.deque))
        return d.median().item()


torch.manual_seed(13)
loader = DataLoader(Noise(), batch_size=4)
model = nn.Linear(6, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
meter, losses = Smoothed(), []
for k, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    meter.update(loss.item())  # host-device sync: Tensor.item 1.0
    losses.append(loss.detach())
    if k % 4 == 3:
        print(f"step {k} loss {meter.median:.4f}")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
