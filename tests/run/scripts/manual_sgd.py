"""Manual SGD with no optimizer and no module: each backward() is one step."""

import json
import sys

import torch

torch.manual_seed(3)
x, y = torch.randn(16, 3), torch.randn(16)
w = torch.zeros(3, requires_grad=True)
losses = []
for _ in range(5):
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad.zero_()
    losses.append(loss.detach())
print("w", [round(v, 4) for v in w.tolist()])  # host-device sync: Tensor.tolist outside 1
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
