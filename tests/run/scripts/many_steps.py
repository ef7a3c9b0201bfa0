"""Many tiny steps (manual SGD): the memory the process holds grows by no more than a few bytes a
step under run. Prints the growth per step (tracemalloc) between step 1,000 and the last."""

import sys
import tracemalloc

import torch

steps = int(sys.argv[1])
w = torch.zeros(3, requires_grad=True)
x = torch.ones(3)
tracemalloc.start()
for step in range(steps):
    loss = ((w * x).sum() - 1.0) ** 2
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
    if step == 1000:
        base = tracemalloc.get_traced_memory()[0]
print(f"{(tracemalloc.get_traced_memory()[0] - base) / (steps - 1001):.1f} bytes a step")
