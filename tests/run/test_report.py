"""The report's rows and suggestions, from made-up audit rows (no script run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncthrottle.run.report import _syncs, suggestions


def _row(site: str, call: str, count: int, in_step: bool) -> dict[str, Any]:
    return {"site": site, "call": call, "count": count, "per_step": count / 10, "in_step": in_step}


def test_a_site_read_only_after_the_last_step_is_outside_steps_and_a_loop_line_stays_in() -> None:
    rows = [_row("t.py:5", "Tensor.item", 10, True), _row("t.py:9", "Tensor.tolist", 1, True)]
    # after the last step's update: line 5's tenth read (the loop's), line 9's only read
    tail = [_row("t.py:5", "Tensor.item", 1, True), _row("t.py:9", "Tensor.tolist", 1, True)]
    assert _syncs(rows, tail, 10) == [
        {"site": "t.py:5", "call": "Tensor.item", "count": 10, "per_step": 1.0, "in_step": True},
        {"site": "t.py:9", "call": "Tensor.tolist", "count": 1, "per_step": 0.1,
         "in_step": False},
    ]


def _data(syncs: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"syncs": syncs, "loader": None, "verdict": "synchronous", "advice": "",
            "input_wait_fraction": 0.0, **more}


def test_a_read_every_step_is_suggested_with_the_name_its_line_reads(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("x = 1\nprint(f'{loss.item():.3f}')\nif loss > 9:\n    pass\n")
    syncs = [{"site": f"{script}:2", "call": "Tensor.item", "count": 10, "per_step": 1.0,
              "in_step": True},
             {"site": f"{script}:3", "call": "Tensor.__bool__", "count": 10, "per_step": 1.0,
              "in_step": True},
             # an evaluation's read, outside steps: no suggestion
             {"site": f"{script}:1", "call": "Tensor.item", "count": 20, "per_step": 2.0,
              "in_step": False}]
    said = suggestions(_data(syncs), synchronous=True)
    assert said == [
        f"{script}:2 calls loss.item() every step: thr.defer(loss) instead, or read it every 50 "
        "steps",
        f"{script}:3 branches on `if loss > 9:` every step: a branch on a device value syncs: compute it "
        "on the device (torch.where), or check it every 50 steps",
    ]


@pytest.mark.parametrize(("synchronous", "expected"), [
    (False, "DataLoader(num_workers=0, pin_memory=False): try num_workers=4, pin_memory=True"),
    (True, "DataLoader(num_workers=0): try num_workers=4"),
])
def test_an_input_bound_loop_is_told_its_dataloader_s_own_arguments(
        synchronous: bool, expected: str) -> None:
    loader = {"num_workers": 0, "pin_memory": False, "batch_size": 8}
    said = suggestions(_data([], loader=loader, input_wait_fraction=0.6), synchronous=synchronous)
    assert said[0] == expected + " (the loop waits for its batches)"
    assert suggestions(_data([], loader=loader, input_wait_fraction=0.1),
                       synchronous=synchronous) == []
