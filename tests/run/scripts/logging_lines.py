"""Logs each step's loss through ``logging``, with the function and the line of each record in
its format. ``run --suggest`` must not move the logging call into a callback: its records would
name the callback and its line, not ``train`` and this line.
"""

import logging
import sys

import torch
from torch import nn

logging.basicConfig(level=logging.INFO, format="%(funcName)s:%(lineno)d %(message)s",
                    stream=sys.stdout)
log = logging.getLogger("train")
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(4)]


def train() -> None:
    for x in batches:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.info("loss %.4f", loss.item())  # host-device sync: Tensor.item 1.0


train()
