"""The tqdm bar's postfix: what it shows of the throttle and of each step's deferred values."""

from __future__ import annotations

import io

import pytest

import asyncthrottle as at
from asyncthrottle._progress import postfix

MICRO = (1.0, 2.0, 6.0)  # one step's micro-batch losses (gradient accumulation in a plain loop)


def _accumulating(progress: object = False) -> at.Throttle:
    thr = at.Throttle(2, device="cpu")
    for _ in thr.wrap(range(2), progress=progress):
        for loss in MICRO:
            thr.defer(loss, name="loss")
        thr.defer(0.5, name="lr")
    return thr


def test_a_name_deferred_once_per_micro_batch_shows_the_mean_of_the_step() -> None:
    thr = _accumulating()
    assert thr.latest["loss"] == list(MICRO)  # the values themselves stay a list
    shown = postfix(thr)
    assert "loss(mean)=3 " in shown + " " and "lr=0.5" in shown  # before: no loss at all


def test_the_bar_shows_it() -> None:
    out = io.StringIO()
    _accumulating(progress={"file": out, "mininterval": 0})
    assert "loss(mean)=3" in out.getvalue()


@pytest.mark.parametrize("value", [[], ["a", "b"], [1.0, [2.0]]])
def test_a_list_without_one_number_per_item_is_not_shown(value: list[object]) -> None:
    thr = at.Throttle(2, device="cpu")
    for _ in thr.wrap(range(1)):
        thr.defer(value, name="x")
    assert "x" not in postfix(thr)
