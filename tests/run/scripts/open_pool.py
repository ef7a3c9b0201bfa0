"""Trains four steps and hands each step's checkpoint to a thread pool that it never shuts
down: python ends the pool's idle (non-daemon) workers at exit, before it joins the threads."""

import io
from concurrent.futures import ThreadPoolExecutor

import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
pool = ThreadPoolExecutor(2)


def save(state: dict[str, torch.Tensor]) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return len(buffer.getvalue())


saved = []
for _ in range(4):
    opt.zero_grad()
    loss = model(torch.ones(4, 3)).pow(2).mean()
    loss.backward()
    opt.step()
    saved.append(pool.submit(save, {k: v.clone() for k, v in model.state_dict().items()}))
print("checkpoints", [future.result() > 0 for future in saved], flush=True)
