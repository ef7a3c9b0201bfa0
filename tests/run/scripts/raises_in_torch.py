"""Fails inside torch calls that the runner wraps, in a chain of exceptions."""

import torch


def value() -> float:
    return torch.tensor([1.0, 2.0]).item()


try:
    value()
except RuntimeError as exc:
    try:
        raise ValueError("not one value") from exc
    except ValueError:
        torch.ones(2, requires_grad=True).mul(2).backward()
