"""Reads device values above its loop, in its loop above and below the one read ``run --suggest``
rewrites (the printed loss), and after it: ``--suggest`` -> ``patch -p1`` -> ``run --json`` ->
``compare --fail-on-new-syncs`` says that read removed and every other the same read, although
the patch's lines above the loop moved each of them."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(5)
data = TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
loader = DataLoader(data, batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scale = model[0].weight.abs().max().item()  # host-device sync: Tensor.item outside 1
clip, outliers = 1.0, []


def spread(t):
    return (t.max() - t.min()).item()  # host-device sync: Tensor.item 1.0


for x, y in loader:
    if x.abs().max() > 100 * scale:  # host-device sync: Tensor.__bool__ 1.0
        outliers.append(x)  # (a print here would keep line 32's print where it is)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
    clip = max(0.5, norm.item())  # host-device sync: Tensor.item 1.0
    opt.step()
    print(f"loss {loss.item():.4f}")  # host-device sync: Tensor.item 1.0
    far = spread(y)
    mean = y.mean().item()  # host-device sync: Tensor.item 1.0
print(f"last loss {float(loss):.4f}, spread {far:.3f}, mean {mean:.3f}")  # host-device sync: Tensor.__float__ outside 1
