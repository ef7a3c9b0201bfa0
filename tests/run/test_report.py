"""The report's rows and suggestions, from made-up audit rows (no script run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncthrottle.run.report import _sync_lines, _syncs, suggestions


def _row(site: str, call: str, count: int, in_step: bool, via: str | None = None,
         ) -> dict[str, Any]:
    return {"site": site, "call": call, "count": count, "per_step": count / 10, "in_step": in_step,
            "via": via}


def test_a_site_read_only_after_the_last_step_is_outside_steps_and_a_loop_line_stays_in() -> None:
    rows = [_row("t.py:5", "Tensor.item", 10, True), _row("t.py:9", "Tensor.tolist", 1, True)]
    # after the last step's update: line 5's tenth read (the loop's), line 9's only read
    tail = [_row("t.py:5", "Tensor.item", 1, True), _row("t.py:9", "Tensor.tolist", 1, True)]
    assert _syncs(rows, tail, 10) == [
        {"site": "t.py:5", "call": "Tensor.item", "count": 10, "per_step": 1.0, "in_step": True,
         "via": None},
        {"site": "t.py:9", "call": "Tensor.tolist", "count": 1, "per_step": 0.1,
         "in_step": False, "via": None},
    ]


def test_a_line_s_own_read_and_its_read_via_a_package_stay_two_rows() -> None:
    via = "fakefw/core.py:2"
    rows = [_row("t.py:5", "Tensor.item", 10, True), _row("t.py:5", "Tensor.item", 5, True, via)]
    # the package's read of the last step only: it leaves the steps, the line's own read stays
    tail = [_row("t.py:5", "Tensor.item", 5, True, via)]
    assert [(r["site"], r["count"], r["in_step"], r["via"]) for r in _syncs(rows, tail, 10)] == [
        ("t.py:5", 10, True, None), ("t.py:5", 5, False, via)]


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


HF, LIGHTNING = "transformers/trainer.py:1919", "lightning/fabric/utilities/apply_func.py:134"


@pytest.mark.parametrize(("row", "advice"), [
    # the HF Trainer's NaN/Inf check of each micro-batch's loss, in its steps
    (_row("hf.py:64", "Tensor.__bool__", 40, True, HF), "set TrainingArguments("
     "logging_nan_inf_filter=False) (its NaN/Inf check of each micro-batch's loss)"),
    # its logging's read, after its step's callback: outside the steps, once a step
    (_row("hf.py:64", "Tensor.item", 10, False, "transformers/trainer.py:2257"),
     "raise TrainingArguments(logging_steps=) (it reads the loss and the grad norm it logs)"),
    (_row("fit.py:60", "Tensor.item", 10, True, LIGHTNING), "log with self.log(..., "
     "on_step=False) (a prog_bar=True value is read every step), or raise "
     "Trainer(log_every_n_steps=) (a logger's values are read then)"),
])
def test_a_framework_s_own_read_is_suggested_with_its_setting_not_thr_defer(
        row: dict[str, Any], advice: str) -> None:
    owner = {"hf.py:64": "the HF Trainer", "fit.py:60": "Lightning"}[row["site"]]
    package = row["via"].split("/")[0]
    often = "4 times a step" if row["count"] == 40 else "every step"
    assert suggestions(_data([row]), synchronous=True) == [
        f"{row['site']} calls {package}, whose {row['via']} reads a device value ({row['call']}) "
        f"{often}: {owner}'s own read, not the script's, so thr.defer cannot move it: {advice}"]


def test_another_package_s_read_is_suggested_with_a_host_value_or_its_setting() -> None:
    # tqdm's set_postfix(loss=loss) prints the tensor the line gave it
    row = _row("t.py:3", "Tensor.__str__", 10, True, "tqdm/std.py:1432")
    assert suggestions(_data([row]), synchronous=True) == [
        "t.py:3 calls tqdm, whose tqdm/std.py:1432 reads a device value (Tensor.__str__) every "
        "step: tqdm's read, not the line's own: hand tqdm a host value (one thr.defer delivered) "
        "instead of a tensor, or look for the tqdm setting that makes it, or call it less often"]
    single = _row("t.py:3", "Tensor.item", 10, True, "fakefw.py:7")  # a one-file package
    assert suggestions(_data([single]), synchronous=True)[0].startswith(
        "t.py:3 calls fakefw, whose fakefw.py:7 reads")


def test_a_framework_s_read_between_its_steps_under_once_a_step_is_not_suggested() -> None:
    # Lightning's check of each loader's length, once an epoch
    rows = [_row("fit.py:60", "Tensor.__bool__", 5, False,
                 "lightning/pytorch/utilities/data.py:105"),
            _row("t.py:9", "Tensor.item", 10, False)]  # the script's own, outside steps
    assert suggestions(_data(rows), synchronous=True) == []


def test_the_sync_table_names_the_package_line_that_made_a_read() -> None:
    rows = [_row("hf.py:64", "Tensor.__bool__", 40, True, HF),
            _row("hf.py:23", "Tensor.item", 5, False)]
    assert _sync_lines(rows) == [
        "  sync sites (site      call" + " " * 47 + "count  per step):",
        "    hf.py:64  Tensor.__bool__ (in transformers/trainer.py:1919)     40      4.00",
        "    hf.py:23  Tensor.item" + " " * 44 + "5      0.50  outside steps",
    ]
