"""A one-cycle learning-rate schedule read every step from a host tensor built of Python floats in
an outer function (as fastai combines its schedules): no sync on any device; and an exponential
moving average whose step counters are registered buffers read every update (as ema-pytorch
keeps them), in a function that also builds a host tensor: a sync each, on an accelerator."""

import json
import sys

import torch
from torch import nn


def combined(points, starts, ends):
    """A piecewise-linear schedule over the fraction of training done."""
    pcts = torch.tensor([0.0, *points])

    def at(pos):
        idx = (pos >= pcts).nonzero().max()
        part = (pos - pcts[idx]) / (pcts[idx + 1] - pcts[idx])
        return starts[idx] + part.item() * (ends[idx] - starts[idx])

    return at


class Average(nn.Module):
    """The model's weights averaged over the steps."""

    def __init__(self, model):
        super().__init__()
        self.shadow = nn.Linear(model.in_features, model.out_features)
        self.register_buffer("initted", torch.tensor(False))
        self.register_buffer("step", torch.tensor(0))

    @torch.no_grad()
    def update(self, model):
        step = self.step.item()  # host-device sync: Tensor.item 1.0
        self.step += 1
        if not self.initted.item():  # host-device sync: Tensor.item 1.0
            self.shadow.load_state_dict(model.state_dict())
            self.initted.copy_(torch.tensor(True))
            return
        decay = min(0.99, (1 + step) / (10 + step))
        for mine, theirs in zip(self.shadow.parameters(), model.parameters(), strict=True):
            mine.lerp_(theirs, 1 - decay)


torch.manual_seed(21)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(5, 1).to(device)
average = Average(model).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lr_at = combined([0.3, 1.0], [0.01, 0.1], [0.1, 0.001])
x, y = torch.randn(64, 5), torch.randn(64, 1)
losses, steps = [], 8
for k in range(steps):
    for group in opt.param_groups:
        group["lr"] = lr_at(k / steps)
    xb, yb = x[k * 8:(k + 1) * 8].to(device), y[k * 8:(k + 1) * 8].to(device)
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    average.update(model)
    losses.append(loss.detach())
with open(sys.argv[1], "w") as out:
    json.dump([float(v) for v in losses], out)  # host-device sync: Tensor.__float__ outside 8
