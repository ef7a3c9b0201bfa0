"""WGAN-GP as it is usually written: a critic update each DataLoader batch (its gradient penalty
by torch.autograd.grad), the generator updated every third batch, in the same batch: one batch
is one step."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(12)
loader = DataLoader(TensorDataset(torch.randn(144, 2) + 3), batch_size=16)
gen = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
critic = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
kept = {"critic": [], "gen": []}
for i, (real,) in enumerate(loader):
    fake = gen(torch.randn(16, 2)).detach()
    eps = torch.rand(16, 1)
    mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(mix).sum(), mix, create_graph=True)
    penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
    loss_c = critic(fake).mean() - critic(real).mean() + 10 * penalty
    opt_c.zero_grad()
    loss_c.backward()
    opt_c.step()
    kept["critic"].append(loss_c.detach())
    if i % 3 == 0:
        loss_g = -critic(gen(torch.randn(16, 2))).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        kept["gen"].append(loss_g.detach())
print("batches", i + 1, "generator updates", len(kept["gen"]))
with open(sys.argv[1], "w") as out:
    json.dump({name: torch.stack(values).tolist()  # host-device sync: Tensor.tolist outside 2
               for name, values in kept.items()}, out)
