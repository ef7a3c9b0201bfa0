"""A NaN check that raises ``RuntimeError``, in a function the script calls inside
``try``/``except RuntimeError``: the script recovers (it says so, its weights still finite, and
exits 0). ``run --suggest`` must not make the check ``nonfinite="raise"``: its
``NonFiniteError`` is a ``FloatingPointError`` the ``except`` does not catch, raised once the step
completes, after the NaN step's ``opt.step()``.
"""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(8, 4) for _ in range(6)]


def train(nan_at: int) -> int:
    for step, x in enumerate(batches):
        loss = model(x).pow(2).mean()
        if step == nan_at:
            loss = loss * float("nan")
        if torch.isnan(loss):  # host-device sync: Tensor.__bool__ 1.0
            raise RuntimeError(f"NaN loss at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return len(batches)


try:
    train(nan_at=3)
except RuntimeError as error:
    print(f"recovered: {error}")
finite = bool(torch.isfinite(model.weight).all())  # host-device sync: Tensor.__bool__ outside 1
print("weights finite:", finite)
