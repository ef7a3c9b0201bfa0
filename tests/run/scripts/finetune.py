"""Pre-training with SGD, then fine-tuning the head with a new Adam in a second loop: seven steps,
each optimizer's losses its own."""

import json
import sys

import torch
from torch import nn

torch.manual_seed(8)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
sgd = torch.optim.SGD(model.parameters(), lr=0.05)
pretrain = []
for _ in range(3):
    sgd.zero_grad()
    loss = nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1))
    loss.backward()
    sgd.step()
    pretrain.append(loss.detach())
for param in model[0].parameters():
    param.requires_grad_(False)
adam = torch.optim.Adam(model[2].parameters(), lr=1e-3)
finetune = []
for _ in range(4):
    adam.zero_grad()
    prediction = model(torch.randn(8, 4))
    loss = nn.functional.mse_loss(prediction, torch.randn(8, 1))
    loss.backward()
    adam.step()
    finetune.append(loss.detach())
print("pretrained", len(pretrain), "fine-tuned", len(finetune))
with open(sys.argv[1], "w") as out:
    json.dump({"first": torch.stack(pretrain).tolist(),  # host-device sync: Tensor.tolist outside 1
               "second": torch.stack(finetune).tolist()},  # host-device sync: Tensor.tolist outside 1
              out)
