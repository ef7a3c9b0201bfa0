"""Its main thread starts a (non-daemon) thread that trains three steps, and returns at once."""

import threading

import torch

returned = threading.Event()


def train() -> None:
    # trains once the main thread's body has come to its end
    returned.wait()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        print("thread step", step, flush=True)


threading.Thread(target=train).start()
print("main returns", flush=True)
returned.set()
