"""The original WGAN's way: the critic's two terms given to backward() with signs,
errD_real.backward(one) and errD_fake.backward(mone), so its loss is errD_real - errD_fake; two
losses at once, torch.autograd.backward([a, b]), for the generator."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(9)
real = DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=8)
gen, critic = nn.Linear(2, 4), nn.Linear(4, 1)
opt_d = torch.optim.RMSprop(critic.parameters(), lr=5e-3)
opt_g = torch.optim.RMSprop(gen.parameters(), lr=5e-3)
one = torch.tensor(1.0)
mone = one * -1
d_losses, g_losses = [], []
for (x,) in real:
    fake = gen(torch.randn(8, 2))
    opt_d.zero_grad()
    err_real = critic(x).mean()
    err_real.backward(one)
    err_fake = critic(fake.detach()).mean()
    err_fake.backward(mone)
    opt_d.step()
    opt_g.zero_grad()
    adversarial = critic(fake).mean()
    size = fake.pow(2).mean()
    torch.autograd.backward([adversarial, size])
    opt_g.step()
    d_losses.append((err_real - err_fake).detach())
    g_losses.append((adversarial + size).detach())
print("trained", len(d_losses), "batches")
with open(sys.argv[1], "w") as out:
    json.dump({"d": torch.stack(d_losses).tolist(),  # host-device sync: Tensor.tolist outside 1
               "g": torch.stack(g_losses).tolist()}, out)  # host-device sync: Tensor.tolist outside 1
