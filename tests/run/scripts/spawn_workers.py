"""Two epochs over a DataLoader with a spawned worker: starting it and joining it at each epoch's
end is not the loop's input wait. (One worker: each spawned one is a process that imports torch,
seconds of a test's time, and run hooks the loader's iterator the same for one worker or many.)"""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    torch.manual_seed(8)
    data = TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    start = time.perf_counter()
    for _ in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    with open(sys.argv[1] + ".seconds", "w") as out:
        out.write(str(time.perf_counter() - start))
    with open(sys.argv[1], "w") as out:
        json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
