"""MAML: each meta-iteration adapts to 3 tasks by torch.autograd.grad (an inner step with
create_graph=True, the adapted weights used functionally), then one backward of the summed query
loss and one meta-update: 5 meta-iterations, 5 steps."""

import json
import sys

import torch
from torch import nn
from torch.func import functional_call

torch.manual_seed(21)
model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
meta = torch.optim.Adam(model.parameters(), lr=1e-3)
kept = []
for _ in range(5):
    meta_loss = torch.zeros(())
    for _ in range(3):
        amplitude = torch.rand(()) * 2 + 0.5
        xs, xq = torch.rand(8, 1) * 6 - 3, torch.rand(8, 1) * 6 - 3
        weights = dict(model.named_parameters())
        support = nn.functional.mse_loss(functional_call(model, weights, (xs,)),
                                         amplitude * torch.sin(xs))
        grads = torch.autograd.grad(support, list(weights.values()), create_graph=True)
        adapted = {name: w - 0.01 * g for (name, w), g in zip(weights.items(), grads, strict=True)}
        query = nn.functional.mse_loss(functional_call(model, adapted, (xq,)),
                                       amplitude * torch.sin(xq))
        meta_loss = meta_loss + query
    meta.zero_grad()
    meta_loss.backward()
    meta.step()
    kept.append(meta_loss.detach())
print("trained", len(kept), "steps")
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(kept).tolist(), out)  # host-device sync: Tensor.tolist outside 1
