"""torch.compile(model) (an OptimizedModule) and an optimizer step compiled in a function, with
gradient accumulation over a DataLoader: twelve batches, two a step. The compiled step calls no
optimizer hook; the same graphs, no warning and six steps under run as under python."""

import json
import sys

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(5)
loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=4)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
compiled = torch.compile(model, backend="eager")
opt = torch.optim.Adam(model.parameters(), lr=0.01)


@torch.compile(backend="eager")
def update() -> None:
    opt.step()


ACCUMULATE = 2
losses, step_loss = [], None
for k, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(compiled(x), y) / ACCUMULATE
    loss.backward()
    step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if (k + 1) % ACCUMULATE == 0:
        update()
        opt.zero_grad()
        losses.append(step_loss)
        step_loss = None
print("trained", len(losses), "steps; graphs", counters["stats"]["unique_graphs"], "breaks",
      sum(counters["graph_break"].values()))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
