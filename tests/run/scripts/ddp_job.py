"""Plain DDP on gloo under torchrun, a DataLoader's batches, one rank made slow in one phase.

``torchrun --nproc-per-node N ddp_job.py OUT [--slow-forward R] [--slow-loader R] [--log-reduce]
[--raise R]``: rank r writes its losses to OUT.r. ``--slow-forward R``: rank R's own work in its
forward is 8x the others' (a count of matmuls); ``--slow-loader R``: rank R's dataset takes 20 ms
a batch (a slow disk); ``--log-reduce``: every step all-reduces the detached loss, only to print
it; ``--raise R``: rank R raises at the start of step 12 (the others then fail in the backward's
all-reduce); ``--io-ms N``: every rank waits N ms a step in its forward (a read from remote
storage: the same on every rank, whatever else the machine's cores run). Every rank destroys
its process group at the end."""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

STEPS = 24
parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--slow-forward", type=int, default=-1)
parser.add_argument("--slow-loader", type=int, default=-1)
parser.add_argument("--log-reduce", action="store_true")
parser.add_argument("--raise", dest="raises", type=int, default=-1)
parser.add_argument("--io-ms", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Batches(Dataset):
    def __len__(self):
        return STEPS * 8

    def __getitem__(self, index):
        if rank == args.slow_loader:
            time.sleep(0.0025)
        g = torch.Generator().manual_seed(index * world + rank)
        return torch.randn(8, generator=g), torch.randn(1, generator=g)


torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
work = torch.randn(96, 96) / 10
losses = []
for step, (x, y) in enumerate(DataLoader(Batches(), batch_size=8)):
    if rank == args.raises and step == STEPS // 2:
        raise RuntimeError(f"rank {rank}: the batch of step {step} is corrupt")
    out = model(x)
    time.sleep(args.io_ms / 1000)
    h = torch.randn(96, 96)
    for _ in range(10 * (8 if rank == args.slow_forward else 1)):
        h = torch.tanh(h @ work)
    loss = nn.functional.mse_loss(out, y) + 0 * h.mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
    if args.log_reduce:
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"step {step}: loss {mean.item() / world:.4f}")
print(f"rank {rank}: {len(losses)} steps", flush=True)
with open(f"{args.out}.{rank}", "w") as file:
    json.dump(torch.stack(losses).tolist(), file)
dist.destroy_process_group()
