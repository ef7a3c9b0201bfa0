"""A loader consumed on another thread (a prefetch thread): its time is not the loop's input wait."""

import json
import queue
import sys
import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(6)
loader = DataLoader(TensorDataset(torch.randn(20, 3), torch.randn(20, 1)), batch_size=5)
batches: queue.Queue = queue.Queue(maxsize=2)


def produce():
    for batch in loader:
        batches.put(batch)
    batches.put(None)


# the model before the thread: the thread's iter(loader) draws its seed from the global generator,
# and the model made beside it would take its weights before or after that draw
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
threading.Thread(target=produce, daemon=True).start()
losses = []
while (batch := batches.get()) is not None:
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())
print("batches", len(losses))
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
