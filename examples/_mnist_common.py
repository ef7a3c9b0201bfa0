"""What the MNIST examples share: the model, the data (real or synthetic), options, and
evaluation."""

from __future__ import annotations

import argparse
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import asyncthrottle as at
from asyncthrottle.backends.torch import detect_device

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
# per connection: a machine without network falls back in seconds, not minutes
DOWNLOAD_TIMEOUT_S = 10.0


class Net(nn.Module):
    """A small CNN for 28x28 digits: two conv blocks and a linear classifier (~25k parameters).

    Args:
        width: multiplies the channels (16 and 32); ``width=32`` (512 and 1024
            channels, ~5M parameters) makes each step heavy enough that a large
            GPU, not the host, is the bottleneck.
    """

    def __init__(self, width: int = 1) -> None:
        super().__init__()
        c1, c2 = 16 * width, 32 * width
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(c2 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


# -- data ----------------------------------------------------------------------


@dataclass
class Data:
    train: Dataset[Any]
    test: Dataset[Any]
    # "mnist" or "synthetic"
    source: str


def synthetic_mnist(train_size: int = 16384, test_size: int = 2048, seed: int = 0) -> Data:
    """MNIST-shaped data that can be learnt: one smooth random pattern per class, shifted, plus
    noise.

    Normalised like MNIST; the same ``seed`` gives the same data on every machine and every rank.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(10, 1, 7, 7, generator=g)
    prototypes = nn.functional.interpolate(coarse, size=(28, 28), mode="bilinear",
                                           align_corners=False)

    def make(n: int) -> TensorDataset:
        labels = torch.randint(0, 10, (n,), generator=g)
        images = prototypes[labels].clone()
        # each digit moves a little, like handwriting
        shifts = torch.randint(-3, 4, (n, 2), generator=g)
        for dy, dx in shifts.unique(dim=0).tolist():
            same = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            images[same] = torch.roll(images[same], shifts=(dy, dx), dims=(2, 3))
        images += 0.6 * torch.randn(images.shape, generator=g)
        return TensorDataset(((images - images.mean()) / images.std()).contiguous(), labels)

    return Data(make(train_size), make(test_size), "synthetic")


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


def real_mnist(data_dir: str, download: bool) -> Data:
    """torchvision's MNIST under ``data_dir``, downloading it if asked (each connection bounded).

    Raises:
        RuntimeError: MNIST is not there (and could not be downloaded).
        ImportError: torchvision is missing (``pip install 'asyncthrottle[examples]'``).
    """
    try:
        from torchvision import datasets, transforms
    except ImportError:
        raise ImportError(
            "--data mnist needs torchvision: pip install 'asyncthrottle[examples]'"
        ) from None
    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
    )
    with _socket_timeout(DOWNLOAD_TIMEOUT_S):
        try:
            train = datasets.MNIST(data_dir, train=True, download=download, transform=transform)
            test = datasets.MNIST(data_dir, train=False, download=download, transform=transform)
        except (OSError, RuntimeError) as exc:
            # URLError and socket.timeout are OSErrors
            where = "and could not be downloaded" if download else "(downloading was not allowed)"
            raise RuntimeError(f"MNIST is not in {data_dir!r} {where}: {exc}") from None
    return Data(train, test, "mnist")


def load_data(kind: str, data_dir: str, seed: int, log: Any = print,
              train_size: int = 16384) -> Data:
    """``kind="mnist"``: real MNIST or an error; ``"synthetic"``; ``"auto"``: MNIST if present or
    downloadable, else synthetic data with a message saying so. ``train_size``: synthetic training
    samples."""
    if kind == "synthetic":
        return synthetic_mnist(train_size, seed=seed)
    if kind == "mnist":
        return real_mnist(data_dir, download=True)
    try:
        return real_mnist(data_dir, download=True)
    except (RuntimeError, ImportError) as exc:
        log(f"note: {exc}")
        log("note: falling back to SYNTHETIC MNIST-shaped data (--data synthetic); accuracy "
            "figures are not MNIST's")
        return synthetic_mnist(train_size, seed=seed)


# -- options -------------------------------------------------------------------


def parse_depth(text: str) -> int | str | None:
    """``--depth``: an int >= 1, ``auto`` (the throttle finds it), or ``none`` (track only, never
    block)."""
    if text.strip().lower() == "none":
        return None
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--depth must be an int >= 1, 'auto' or 'none', got {text!r}; 2 is a good default"
        )
    return value


def positive(kind: type[int] | type[float], name: str) -> Any:
    """An argparse type for ``--name``: a number > 0, with an error that names the value."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(
                f"--{name} must be a {kind.__name__} > 0, got {text!r}"
            )
        return value

    return parse


def non_negative_int(name: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"--{name} must be an int >= 0, got {text!r}")
        return value

    return parse


def add_training_options(p: argparse.ArgumentParser) -> None:
    """The options both examples take."""
    p.add_argument("--data", choices=("auto", "mnist", "synthetic"), default="auto",
                   help="auto: MNIST if present or downloadable, else synthetic (default)")
    p.add_argument("--data-dir", default="data",
                   help="where MNIST is (or is downloaded to); default ./data")
    p.add_argument("--depth", type=parse_depth, default=2,
                   help="minibatches in flight: an int >= 1, 'auto' or 'none'")
    p.add_argument("--epochs", type=positive(int, "epochs"), default=2)
    p.add_argument("--batch-size", type=positive(int, "batch-size"), default=64)
    p.add_argument("--lr", type=positive(float, "lr"), default=0.05,
                   help="SGD learning rate (momentum 0.9)")
    p.add_argument("--workers", type=non_negative_int("workers"), default=None,
                   help="DataLoader workers (default: 2 with an accelerator, 0 on the CPU)")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:1, mps, xpu or cpu (default: auto-detect)")
    p.add_argument("--max-steps", type=positive(int, "max-steps"), default=None,
                   help="at most this many training steps per epoch (default: all; 200 on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")


# default steps per epoch without an accelerator: a run stays around a minute
CPU_MAX_STEPS = 200


def step_cap(args: argparse.Namespace, device: torch.device, log: Any = print,
             cap: int = CPU_MAX_STEPS) -> int | None:
    """``--max-steps``, or ``cap`` without an accelerator (said once), so CPU runs stay short."""
    if args.max_steps is not None or device.type != "cpu":
        return int(args.max_steps) if args.max_steps is not None else None
    log(f"note: no accelerator here, so each epoch stops after {cap} steps (--max-steps to change)")
    return cap


def loader_options(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """DataLoader options: workers on an accelerator, and page-locked memory where copies can be
    non-blocking."""
    workers = args.workers if args.workers is not None else (2 if device.type != "cpu" else 0)
    options: dict[str, Any] = {
        "batch_size": args.batch_size,
        "num_workers": workers,
        # page-locked host memory: truly asynchronous copies
        "pin_memory": device.type in ("cuda", "xpu"),
    }
    if workers:
        options["persistent_workers"] = True
    return options


def resolve_device(name: str | None) -> torch.device:
    """``--device``: auto-detect when None; an explicit device must be available."""
    if name is None:
        return torch.device(detect_device())
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(
            f"error: --device {name!r} is not a device torch knows; try cuda, mps, xpu or cpu"
        ) from None
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and not (module is not None and module.is_available()):
        raise SystemExit(
            f"error: --device {name!r} is not available here (torch.{device.type}.is_available() "
            "is False); leave --device out to auto-detect, or pass --device cpu"
        )
    return device


# -- evaluation ----------------------------------------------------------------


def evaluate(model: nn.Module, loader: Any, device: torch.device,
             depth: int | str | None) -> tuple[int, int]:
    """(correct, total) over ``loader``; the counts stay on the device until one read at the end."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    with torch.no_grad():
        for x, y in at.throttle(loader, depth=depth, device=device):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            correct += (model(x).argmax(1) == y).sum()
            total += len(y)
    model.train()
    return int(correct.item()), total  # host-device sync: once per evaluation
