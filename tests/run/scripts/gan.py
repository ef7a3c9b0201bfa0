"""A GAN: two optimizers a batch (the discriminator's step, then the generator's), one step a
batch; each loss series on its own."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(5)
real = DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=8)
gen, disc = nn.Linear(2, 4), nn.Sequential(nn.Linear(4, 1))
opt_d = torch.optim.Adam(disc.parameters(), lr=1e-2)
opt_g = torch.optim.SGD(gen.parameters(), lr=1e-2)
bce = nn.functional.binary_cross_entropy_with_logits
d_losses, g_losses = [], []
for (x,) in real:
    fake = gen(torch.randn(8, 2))
    d_loss = bce(disc(x), torch.ones(8, 1)) + bce(disc(fake.detach()), torch.zeros(8, 1))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = bce(disc(fake), torch.ones(8, 1))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    d_losses.append(d_loss.detach())
    g_losses.append(g_loss.detach())
print("trained", len(d_losses), "batches")
with open(sys.argv[1], "w") as out:
    json.dump({"d": torch.stack(d_losses).tolist(),  # host-device sync: Tensor.tolist outside 1
               "g": torch.stack(g_losses).tolist()}, out)  # host-device sync: Tensor.tolist outside 1
