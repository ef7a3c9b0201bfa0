"""The loss the runner takes from a ``backward()`` call: what autograd differentiates."""

from __future__ import annotations

from typing import Any

import pytest

from asyncthrottle.run.losses import Losses

torch = pytest.importorskip("torch")


@pytest.fixture(params=[True, False], ids=["synchronous", "deferred"])
def losses(request: Any) -> Losses:
    made = Losses()
    made.synchronous = request.param
    return made


def _read(value: Any) -> float | None:
    return value if value is None or isinstance(value, float) else float(value)


@pytest.mark.parametrize(("tensors", "weights", "loss"), [
    (torch.tensor(2.0), None, 2.0),
    ([torch.tensor(2.0)], None, 2.0),
    ((torch.tensor(2.0), torch.tensor(3.0)), None, 5.0),
    (torch.tensor(2.0), torch.tensor(-1.0), -2.0),
    ([torch.tensor(2.0), torch.tensor(3.0)], [torch.tensor(1.0), torch.tensor(-1.0)], -1.0),
    ([torch.tensor(2.0), torch.tensor(3.0)], [None, torch.tensor(2.0)], 8.0),
    (torch.ones(3), torch.ones(3), None),  # a vector-Jacobian product: no loss
    ([torch.tensor(2.0), torch.ones(2)], None, None),
    ([torch.tensor(2.0)], [torch.tensor(1.0), torch.tensor(1.0)], None),
    ([], None, None),
])
def test_the_loss_is_the_weighted_sum_of_scalars(losses: Losses, tensors: Any, weights: Any,
                                                 loss: float | None) -> None:
    got = _read(losses.value(tensors, weights))
    assert got == (None if loss is None else pytest.approx(loss))


def test_a_scaled_loss_is_read_unscaled(losses: Losses) -> None:
    small = torch.tensor(0.5)
    big = small * 1024
    losses.scale(big, small)
    assert _read(losses.value(big, torch.tensor(-1.0))) == pytest.approx(-0.5)
