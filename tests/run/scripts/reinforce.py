"""REINFORCE: an episode of 10 forwards with grad (the log-probabilities kept), then one update on
the episode's return: 6 episodes, 6 steps."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(16)
policy = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
kept = []
for _ in range(6):
    state, log_probs, rewards = torch.zeros(3), [], []
    for _ in range(10):
        dist = torch.distributions.Categorical(logits=policy(state))
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        rewards.append(torch.where(action == 0, 1.0, -0.5))
        state = torch.roll(state, 1) + 0.1
    returns = torch.cumsum(torch.stack(rewards).flip(0), 0).flip(0)
    loss = -(torch.stack(log_probs) * returns).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    kept.append(loss.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
