"""The value a step's ``backward()`` is called on, as the runner keeps it: unscaled where a
``GradScaler`` scaled it, read on the host at once on a synchronous device."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Losses"]


class Losses:
    """What ``backward()`` was called on, as a step's loss.

    Attributes:
        synchronous: the runner's device runs each step as it is issued (the CPU): a loss is
            read as its ``backward()`` is called (a host read, where an accelerator's is a copy
            deferred to the step's end).
    """

    def __init__(self) -> None:
        self.synchronous = False
        # GradScaler.scale's outputs (by id) and what they scaled: taken by the backward() of one
        self._scaled: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self._item: Callable[[Any], Any] | None = None

    def scale(self, scaled: Any, original: Any) -> None:
        """``GradScaler.scale(original)`` returned ``scaled``."""
        pairs = (zip(scaled, original, strict=False) if isinstance(scaled, (list, tuple))
                 else [(scaled, original)])
        if len(self._scaled) > 64:
            # outputs scaled and never given to backward()
            self._scaled.clear()
        for big, small in pairs:
            if big is not small:
                self._scaled[id(big)] = (weakref.ref(big), small)

    def value(self, tensors: Any, weights: Any = None) -> Any:
        """The loss ``backward(tensors, weights)`` stands for, unscaled (a float on a synchronous
        device, else a tensor detached): that of a scalar tensor; of several (``weights``: their
        ``grad_tensors``, None for ones), what autograd differentiates, the sum of each scalar
        times its weight (``errD_real.backward(mone)`` is ``-errD_real``). None where a tensor is
        not a scalar (a vector-Jacobian product has no loss)."""
        if weights is None and not isinstance(tensors, (list, tuple)):
            return self._scalar(tensors, None)
        many = isinstance(tensors, (list, tuple))
        tensors = list(tensors) if many else [tensors]
        weights = (list(weights) if isinstance(weights, (list, tuple))
                   else [weights] * len(tensors) if weights is None else [weights])
        if not tensors or len(weights) != len(tensors):
            return None
        total = None
        for tensor, weight in zip(tensors, weights, strict=True):
            value = self._scalar(tensor, weight)
            if value is None:
                return None
            total = value if total is None else total + value
        return total

    def _scalar(self, tensor: Any, weight: Any) -> Any:
        # (none scaled, no look-up: every step of a script without a GradScaler)
        kept = self._scaled.pop(id(tensor), None) if self._scaled else None
        if kept is not None and kept[0]() is tensor:
            tensor = kept[1]
        numel = getattr(tensor, "numel", None)
        if numel is None or numel() != 1:
            return None
        if weight is not None and getattr(weight, "numel", lambda: 1)() != 1:
            return None
        if not self.synchronous:
            value = tensor.detach()
            # (a tensor weight: one more device op, where a script passes one)
            return value if weight is None else value * getattr(weight, "detach", lambda: weight)()
        item = self._item
        if item is None:
            item = self._item = _base_item()
        try:
            value = float(item(tensor))
            return value if weight is None else value * float(
                item(weight) if hasattr(weight, "numel") else weight)
        except (TypeError, ValueError, RuntimeError):
            return None


def _base_item() -> Callable[[Any], Any]:
    """torch's own ``item``, the tensor base class's: the sync audit's patch of ``torch.Tensor``
    does not cover it, so the runner's read of a loss is not looked up as the script's."""
    import torch

    return torch._C.TensorBase.item  # type: ignore[no-any-return]
