"""Two augmented views a batch of a DataLoader (contrastive learning): two forwards, one loss over
both, one backward and one update: 8 batches, 8 steps."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(19)
loader = DataLoader(TensorDataset(torch.randn(32, 6)), batch_size=4)
encoder = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(encoder.parameters(), lr=0.05)
kept = []
for (x,) in loader:
    first = encoder(x + 0.1 * torch.randn_like(x))
    second = encoder(x * (1 + 0.1 * torch.randn_like(x)))
    logits = nn.functional.normalize(first, dim=1) @ nn.functional.normalize(second, dim=1).T
    loss = nn.functional.cross_entropy(logits / 0.5, torch.arange(len(x)))
    opt.zero_grad()
    loss.backward()
    opt.step()
    kept.append(loss.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
