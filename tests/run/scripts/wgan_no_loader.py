"""A WGAN over batches the loop makes itself (no DataLoader): the critic's update every
iteration, the generator's after it every 4th: 12 iterations, 12 steps; a step's loss is its
backward() calls' (the critic's, plus the generator's where it trained)."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(13)
gen, critic = nn.Linear(2, 4), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt_c = torch.optim.RMSprop(critic.parameters(), lr=5e-4)
opt_g = torch.optim.RMSprop(gen.parameters(), lr=5e-4)
kept = []
for k in range(12):
    real = torch.randn(8, 4) + 1.0
    fake = gen(torch.randn(8, 2))
    c_loss = critic(fake.detach()).mean() - critic(real).mean()
    opt_c.zero_grad()
    c_loss.backward()
    opt_c.step()
    step_loss = c_loss.detach()
    if k % 4 == 3:
        g_loss = -critic(gen(torch.randn(8, 2))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        step_loss = step_loss + g_loss.detach()
    kept.append(step_loss)
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
