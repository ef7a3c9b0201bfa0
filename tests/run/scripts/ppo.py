"""PPO without a DataLoader: each iteration a rollout of 16 forwards under no_grad (the action
read to step a toy environment of 3 ms a step: outside steps, and its 48 ms no step's time),
then 2 epochs of 4 minibatch updates, each a step (its loss logged: a read in the step): 3
iterations, 24 steps."""

import json
import sys
import time

import torch
from torch import nn

torch.manual_seed(15)
policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
kept, logged = [], []
state = torch.zeros(4)
for _ in range(3):
    states, actions, rewards, old = [], [], [], []
    with torch.no_grad():
        for _ in range(16):
            logits = policy(state)
            action = torch.distributions.Categorical(logits=logits).sample()
            a = action.item()  # host-device sync: Tensor.item outside 48
            states.append(state)
            actions.append(action)
            old.append(torch.log_softmax(logits, -1)[action])
            rewards.append(1.0 if a == 0 else -1.0)
            state = torch.roll(state, 1) + 0.1 * (1 if a == 0 else -1)
            # the environment's step: 3 ms of host time, 48 ms a rollout (no step's)
            until = time.perf_counter() + 0.003
            while time.perf_counter() < until:
                pass
    states, actions, old = torch.stack(states), torch.stack(actions), torch.stack(old)
    advantage = torch.tensor(rewards)
    for _ in range(2):
        for start in range(0, 16, 4):
            idx = slice(start, start + 4)
            logp = torch.log_softmax(policy(states[idx]), -1)
            logp = logp.gather(1, actions[idx].unsqueeze(1)).squeeze(1)
            ratio = torch.exp(logp - old[idx])
            clipped = torch.clamp(ratio, 0.8, 1.2)
            loss = -torch.min(ratio * advantage[idx], clipped * advantage[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(loss.detach())
            logged.append(loss.item())  # host-device sync: Tensor.item 1.0
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
