"""A training loop stopped by Ctrl-C after two steps."""

import torch

torch.manual_seed(7)
w = torch.zeros(2, requires_grad=True)
for step in range(5):
    loss = (w - 1).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
    if step == 1:
        raise KeyboardInterrupt
