"""Truncated backpropagation through time over a DataLoader of long sequences: each batch split
into 3 chunks, each chunk a forward from the detached hidden state, a backward and an update:
several updates a batch, each a step: 4 batches, 12 steps."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(18)
loader = DataLoader(TensorDataset(torch.randn(16, 12, 3), torch.randn(16, 12, 1)), batch_size=4)
rnn, head = nn.GRU(3, 8, batch_first=True), nn.Linear(8, 1)
opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-2)
kept = []
for x, y in loader:
    hidden = None
    for start in range(0, 12, 4):
        out, hidden = rnn(x[:, start:start + 4], hidden)
        loss = nn.functional.mse_loss(head(out), y[:, start:start + 4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        hidden = hidden.detach()
        kept.append(loss.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
