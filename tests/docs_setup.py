"""What the documentation's examples assume exists: the user's loader, step and model, small and on the CPU.

tests/test_docs.py runs each page's ```python blocks in order, in one namespace per page. Before a block it
runs the setup named by a ``<!-- setup: NAME -->`` comment just above the block (``loop`` when none is named).
Each setup stands for what a reader already has: their DataLoader, their training step, their logger.
"""

SETUPS = {
    # A DataLoader of (x, y) minibatches, a model, and one training step on them.
    "loop": """
import torch as _torch

import asyncthrottle
import asyncthrottle as at

device = "cpu"

model = _torch.nn.Linear(8, 4)
optimizer = _torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = _torch.nn.functional.cross_entropy
_data = _torch.utils.data.TensorDataset(_torch.randn(64, 8), _torch.randint(0, 4, (64,)))
loader = train_loader = _torch.utils.data.DataLoader(_data, batch_size=8)
batch = next(iter(loader))


def train_step(x, y=None):
    if y is None:
        x, y = x
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


class _Sink:
    def add_scalar(self, *args, **kwargs): pass
    def log(self, *args, **kwargs): pass


writer = logger = _Sink()
""",
    # A report that python -m asyncthrottle run --json wrote, as report.json (a real run of a tiny script).
    "report": """
import pathlib as _pathlib
import subprocess as _subprocess
import sys as _sys

if not _pathlib.Path("report.json").exists():
    _pathlib.Path("_train.py").write_text(
        "import torch\\n"
        "model = torch.nn.Linear(2, 1)\\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\\n"
        "for _ in range(3):\\n"
        "    loss = model(torch.randn(4, 2)).pow(2).mean()\\n"
        "    opt.zero_grad()\\n"
        "    loss.backward()\\n"
        "    opt.step()\\n"
        "    print(loss.item())\\n")
    _subprocess.run([_sys.executable, "-m", "asyncthrottle", "run", "--json", "report.json", "_train.py"],
                    check=True, capture_output=True)
""",
    # JAX: a jitted step on a small state, and a loader of numpy batches.
    "jax": """
import asyncthrottle as at
import jax as _jax
import jax.numpy as _jnp
import numpy as _np

loader = [_np.full((4, 8), i, dtype=_np.float32) for i in range(6)]
state = _jnp.zeros(8)


@_jax.jit
def train_step(state, batch):
    loss = ((batch - state) ** 2).mean()
    return state + 0.1 * (batch.mean(0) - state), loss


sharded_step = train_step
""",
    # Lightning: a tiny LightningModule; lightning.Trainer is the real one, one short epoch on the CPU.
    "lightning": """
import asyncthrottle as at
import functools as _functools
import tempfile as _tempfile
import types as _types

import lightning as _L
import torch as _torch


class _Tiny(_L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = _torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return _torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return _torch.optim.SGD(self.parameters(), lr=0.1)


model = _Tiny()
_data = _torch.utils.data.TensorDataset(_torch.randn(32, 8), _torch.randn(32, 1))
train_loader = val_loader = _torch.utils.data.DataLoader(_data, batch_size=8)
lightning = _types.SimpleNamespace(Trainer=_functools.partial(
    _L.Trainer, max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
    enable_model_summary=False, default_root_dir=_tempfile.mkdtemp()))
""",
    # accelerate: the loop's model, optimizer and loader, prepared by a real Accelerator on the CPU.
    "accelerate": """
import asyncthrottle as at
import torch as _torch
from accelerate import Accelerator

model = _torch.nn.Linear(8, 4)
optimizer = _torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = _torch.nn.functional.cross_entropy
_data = _torch.utils.data.TensorDataset(_torch.randn(64, 8), _torch.randint(0, 4, (64,)))
loader = _torch.utils.data.DataLoader(_data, batch_size=8)
""",
}
