"""Its main thread starts a (non-daemon) thread that trains three steps, and returns at once."""

import threading
import time

import torch


def train() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        time.sleep(0.2)
        opt.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        print("thread step", step, flush=True)


threading.Thread(target=train).start()
print("main returns", flush=True)
