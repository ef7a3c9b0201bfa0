"""An optimizer step that raises on one batch (as an out-of-memory error would), caught by the
loop, which skips that batch: every other batch is a step."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Flaky(torch.optim.SGD):
    """SGD whose third step raises before updating."""

    calls = 0

    def step(self, closure=None):
        Flaky.calls += 1
        if Flaky.calls == 3:
            raise RuntimeError("CUDA out of memory (simulated)")
        return super().step(closure)


torch.manual_seed(6)
loader = DataLoader(TensorDataset(torch.randn(40, 3), torch.randn(40, 1)), batch_size=4)
model = nn.Linear(3, 1)
opt = Flaky(model.parameters(), lr=0.1)
losses, skipped = [], 0
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    try:
        opt.step()
    except RuntimeError:
        skipped += 1
        continue
    losses.append(loss.detach())
print("trained", len(losses), "skipped", skipped)
with open(sys.argv[1], "w") as out:
    json.dump(torch.stack(losses).tolist(), out)  # host-device sync: Tensor.tolist outside 1
