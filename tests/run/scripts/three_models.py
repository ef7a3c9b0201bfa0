"""Three models, each with its own optimizer, trained on the same batch of a DataLoader (an
ensemble): one step a batch, as a GAN's two optimizers: 10 batches, 10 steps."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(14)
loader = DataLoader(TensorDataset(torch.randn(40, 5), torch.randn(40, 1)), batch_size=4)
models = [nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1)) for _ in range(3)]
opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in models]
kept = []
for x, y in loader:
    step_loss = None
    for model, opt in zip(models, opts, strict=True):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    kept.append(step_loss)
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
