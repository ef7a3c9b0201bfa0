"""DQN with a target network, no DataLoader: the online network's forward with grad, the target
network's under no_grad after it, one update; the target copied every 5 updates: 15 steps."""

import copy
import json
import sys

import torch
from torch import nn

torch.manual_seed(17)
online = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
target = copy.deepcopy(online)
opt = torch.optim.Adam(online.parameters(), lr=1e-3)
kept = []
for k in range(15):
    s, s2 = torch.randn(8, 4), torch.randn(8, 4)
    a, r = torch.randint(0, 3, (8,)), torch.randn(8)
    q = online(s).gather(1, a.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        goal = r + 0.99 * target(s2).max(1).values
    loss = nn.functional.smooth_l1_loss(q, goal)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if k % 5 == 4:
        target.load_state_dict(online.state_dict())
    kept.append(loss.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
