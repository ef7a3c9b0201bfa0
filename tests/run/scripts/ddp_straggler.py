"""Plain DDP on gloo, 2 ranks under torchrun, rank 1 the straggler: its own work is 8x rank 0's.

``torchrun --nproc-per-node 2 ddp_straggler.py OUT``: rank r writes its losses to OUT.r."""

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 30
# rank 1 does this many times rank 0's own work each step (a count of matmuls, not a clock)
SLOWER = 8

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
work = torch.randn(96, 96) / 10
losses = []
for _ in range(STEPS):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    out = model(x)
    # the rank's own work, in its forward section: a chain of matmuls
    h = torch.randn(96, 96)
    for _ in range(40 * (SLOWER if rank == 1 else 1)):
        h = torch.tanh(h @ work)
    loss = nn.functional.mse_loss(out, y) + 0 * h.mean()
    opt.zero_grad()
    # DDP's all-reduce: the fast rank waits here for the slow one
    loss.backward()
    opt.step()
    losses.append(loss.detach())
print(f"rank {rank}: {len(losses)} steps", flush=True)
with open(f"{sys.argv[1]}.{rank}", "w") as file:
    json.dump(torch.stack(losses).tolist(), file)  # host-device sync: Tensor.tolist outside 1
dist.destroy_process_group()
