"""The report's rows, suggestions and text, from made-up audit rows and fake sources (no script
run)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _runs import under_run, valid

from asyncthrottle.run.advice import recovers, suggestions
from asyncthrottle.run.report import _syncs, collect
from asyncthrottle.run.text import GLOSSARY, _sync_lines, figure, nothing_found, text


def _row(site: str, call: str, count: int, in_step: bool, via: str | None = None,
         blocked_s: float | None = None) -> dict[str, Any]:
    return {"site": site, "call": call, "count": count, "per_step": count / 10, "in_step": in_step,
            "via": via, "blocked_s": blocked_s,
            "blocked_per_step_s": blocked_s / 10 if blocked_s is not None else None}


# what a read suggested on a synchronous device says a fix recovers: nothing (the report says
# once why a fix pays on an accelerator: text.synchronous_note)
SYNC = ""


def test_a_site_read_only_after_the_last_step_is_outside_steps_and_a_loop_line_stays_in() -> None:
    rows = [_row("t.py:5", "Tensor.item", 10, True, blocked_s=0.5),
            _row("t.py:9", "Tensor.tolist", 1, True, blocked_s=0.25)]
    # after the last step's update: line 5's tenth read (the loop's), line 9's only read
    tail = [_row("t.py:5", "Tensor.item", 1, True, blocked_s=0.05),
            _row("t.py:9", "Tensor.tolist", 1, True, blocked_s=0.25)]
    assert _syncs(rows, tail, 10) == [
        {"site": "t.py:5", "call": "Tensor.item", "count": 10, "per_step": 1.0, "in_step": True,
         "via": None, "file": None, "blocked_s": 0.5, "blocked_per_step_s": 0.05,
         "function": None, "text": None},
        {"site": "t.py:9", "call": "Tensor.tolist", "count": 1, "per_step": 0.1,
         "in_step": False, "via": None, "file": None, "blocked_s": 0.25,
         "blocked_per_step_s": 0.025, "function": None, "text": None},
    ]


def test_rows_merged_add_their_time_blocked_and_untimed_rows_stay_untimed() -> None:
    rows = [_row("t.py:5", "Tensor.item", 6, True, blocked_s=0.5),
            _row("t.py:5", "Tensor.item", 4, True, blocked_s=0.25),  # one display site, 2 files
            _row("t.py:5", "Tensor.item", 2, True, blocked_s=None),
            _row("t.py:7", "CUDA sync", 3, True)]
    tail = [_row("t.py:7", "CUDA sync", 3, True)]  # read only after the last update: moved out
    assert [(r["site"], r["count"], r["in_step"], r["blocked_s"], r["blocked_per_step_s"])
            for r in _syncs(rows, tail, 10)] == [("t.py:5", 12, True, 0.75, 0.075),
                                                 ("t.py:7", 3, False, None, None)]
    assert _syncs(rows[:1], [], 0)[0]["blocked_per_step_s"] is None  # no steps


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
        "steps" + SYNC,
        f"{script}:3 branches on `if loss > 9:` every step: a branch on a device value syncs: compute it "
        "on the device (torch.where), or check it every 50 steps" + SYNC,
    ]


USED = ("the lines after it use the value (not only a log), so thr.defer cannot deliver it in "
        "time")


@pytest.mark.parametrize(("line", "call", "is_used"), [
    # a DQN's action, handed to the environments
    ("actions = q.argmax(1).cpu().numpy()\nobs = envs.step(actions)\n", "Tensor.cpu", True),
    ("obs = envs.step(q.argmax(1).cpu().numpy())\n", "Tensor.cpu", True),
    ("row = table[k.item()]\n", "Tensor.item", True),  # an index
    ("step = counter.item()\ndecay = min(0.99, step / 10)\n", "Tensor.item", True),
    ("def lr(t):\n    return t.item()\n", "Tensor.item", True),
    # an assignment that reads what it assigns (followed once)
    ("w = k.item()\nw = w * 2\nx = x * w\nmodel(x)\n", "Tensor.item", True),
    ("w = k.item()\nw = w * 2\nprint(w)\n", "Tensor.item", False),
    # only logged
    ("print(loss.item())\n", "Tensor.item", False),
    ("losses.append(loss.item())\n", "Tensor.item", False),
    ("meter.update(loss.item())\n", "Tensor.item", False),
    ("value = loss.item()\nlog.info('loss %.3f', value)\nprint(f'{value}')\n", "Tensor.item",
     False),
])
def test_a_value_the_next_lines_use_is_never_told_to_thr_defer(
        tmp_path: Path, line: str, call: str, is_used: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(line)
    site = 2 if line.startswith("def") else 1
    said = suggestions(_data([_row(f"{script}:{site}", call, 10, True)]), synchronous=True)
    assert (USED in said[0]) == is_used and ("thr.defer(" in said[0]) != is_used, said


def test_a_framework_s_read_in_its_step_and_after_it_is_one_suggestion_with_both_counts() -> None:
    """Lightning reads a ``prog_bar=True`` value in its step and again after it (its progress bar,
    its logger): two rows of the table, one read to change, said once."""
    via = "lightning/fabric/utilities/apply_func.py:134"
    rows = [_row("t.py:18", "Tensor.item", 10, True, via, blocked_s=0.5),
            _row("t.py:18", "Tensor.item", 10, False, via, blocked_s=0.25),
            # the line's own read stays a read of its own
            _row("t.py:18", "Tensor.item", 10, True)]
    said = suggestions(_data(rows), synchronous=False)
    assert len(said) == 2, said
    # the steps' reads as the table counts them, those between the steps apart
    assert said[0].startswith(f"t.py:18 calls lightning, whose {via} reads a device value "
                              "(Tensor.item) every step (and 10 times outside the steps): "
                              "Lightning's own read"), said
    assert said[0].endswith("a fix recovers at most 75.0 ms a step, the time it blocks"), said
    assert said[1].startswith("t.py:18 calls "), said
    # the table keeps its rows
    assert [row["in_step"] for row in rows] == [True, False, True]


def test_an_f_string_s_suggestion_names_the_fields_that_formatted_tensors(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text('print(f"epoch {epoch} step {i} loss {loss:.4f} {acc}")\n')
    rows = [_row(f"{script}:1", "Tensor.__format__", 10, True)]
    rows[0]["fields"] = [2, 3]
    (row,) = _syncs(rows, [], 10)
    assert row["fields"] == [2, 3]
    said = suggestions(_data([row]), synchronous=True)
    assert said[0].startswith(f"{script}:1 calls f'{{loss}}' and f'{{acc}}' every step"), said
    # fields not known (an older report): every field of the line, as before
    del row["fields"]
    said = suggestions(_data([row]), synchronous=True)
    assert "f'{epoch}' and f'{i}' and f'{loss}' and f'{acc}'" in said[0], said


_LOADER = {"num_workers": 0, "pin_memory": False, "pin_memory_in_effect": False,
           "pin_memory_off": None, "batch_size": 8, "batched_by": None}
_PINNED_OFF = {**_LOADER, "pin_memory": True, "pin_memory_off": "no accelerator"}


@pytest.mark.parametrize(("loader", "synchronous", "expected"), [
    (_LOADER, False, "DataLoader(num_workers=0, pin_memory=False, batch_size=8): try num_workers=4, "
                     "pin_memory=True"),
    (_LOADER, True, "DataLoader(num_workers=0, batch_size=8): try num_workers=4"),
    # the script wrote pin_memory=True, which torch turned off: said why, never suggested again
    (_PINNED_OFF, False, "DataLoader(num_workers=0, pin_memory=True (off: no accelerator), "
                         "batch_size=8): try num_workers=4"),
    ({**_LOADER, "pin_memory": True, "pin_memory_in_effect": True, "num_workers": 4}, False,
     "DataLoader(num_workers=4, pin_memory=True, batch_size=8): try num_workers=8"),
    # fastai batches over a torch DataLoader made with batch_size=None
    ({**_LOADER, "batch_size": 64, "batched_by": "fastai.data.core.TfmdDL"}, True,
     "DataLoader(num_workers=0, batch_size=64 (batched by fastai's TfmdDL)): try num_workers=4"),
    # a report older than pin_memory_in_effect: its pin_memory was what was in effect
    ({"num_workers": 0, "pin_memory": False, "batch_size": 8}, False,
     "DataLoader(num_workers=0, pin_memory=False, batch_size=8): try num_workers=4, pin_memory=True"),
])
def test_an_input_bound_loop_is_told_its_dataloader_as_written_and_what_to_try(
        loader: dict[str, Any], synchronous: bool, expected: str) -> None:
    said = suggestions(_data([], loader=loader, input_wait_fraction=0.6), synchronous=synchronous)
    assert said[0] == expected + " (the loop waits for its batches)"
    assert suggestions(_data([], loader=loader, input_wait_fraction=0.1),
                       synchronous=synchronous) == []


def test_the_text_says_the_loader_as_written_with_what_torch_runs_beside_it() -> None:
    data = {"script": "train.py", "argv": ["train.py"], "exit_code": 0, "steps": 4,
            "steps_per_s": 10.0, "stats": {"wall_s": 0.4}, "seen": {}, "error": None,
            "verdict": "synchronous", "advice": "", "losses": [1.0] * 4, "nonfinite": [],
            "last_nonfinite": None, "sections": {}, "input_wait_s": 0.0,
            "input_wait_fraction": 0.0, "syncs": [], "suggestions": [], "trace": None,
            "loader": {**_PINNED_OFF, "batch_size": 4}}
    lines = text(data).splitlines()
    assert "  loader: DataLoader(num_workers=0, pin_memory=True (off: no accelerator), " \
           "batch_size=4)" in lines
    assert not [line for line in text({**data, "loader": None}).splitlines()
                if line.startswith("  loader:")]


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
        f"{often}: {owner}'s own read, not the script's, so thr.defer cannot move it: {advice}"
        + SYNC]


def test_another_package_s_read_is_suggested_with_a_host_value_or_its_setting() -> None:
    # tqdm's set_postfix(loss=loss) prints the tensor the line gave it
    row = _row("t.py:3", "Tensor.__str__", 10, True, "tqdm/std.py:1432")
    assert suggestions(_data([row]), synchronous=True) == [
        "t.py:3 calls tqdm, whose tqdm/std.py:1432 reads a device value (Tensor.__str__) every "
        "step: tqdm's read, not the line's own: where the line hands tqdm a tensor, hand it a "
        "host value (one thr.defer delivered) instead; else it reads a value it computed: look "
        "for the tqdm setting that makes it, or call it less often" + SYNC]
    single = _row("t.py:3", "Tensor.item", 10, True, "fakefw.py:7")  # a one-file package
    assert suggestions(_data([single]), synchronous=True)[0].startswith(
        "t.py:3 calls fakefw, whose fakefw.py:7 reads")


@pytest.mark.parametrize(("via", "line", "said"), [
    ("ignite/engine/__init__.py:117", "trainer.run(loader, max_epochs=3)\n",
     "Ignite's own read, not the script's, so thr.defer cannot move it: give "
     "create_supervised_trainer(output_transform=...) a function that returns the loss tensor"),
    ("skorch/net.py:1200", "net.fit(X, y)\n", "skorch's own read of a value it computed"),
    ("fastai/learner.py:220", "learn.fit_one_cycle(1)\n", "fastai's own read of a value it "
     "computed"),
    # an unknown package the line hands nothing: its own value, never "hand it a host value"
    ("trainlib/loop.py:40", "trainer.train()\n", "trainlib's own read of a value it computed"),
    ("trainlib/loop.py:40", "trainer.log(loss)\n", "where the line hands trainlib a tensor, "
     "hand it a host value"),
])
def test_a_framework_s_read_of_its_own_loss_names_its_setting_or_what_it_is(
        tmp_path: Path, via: str, line: str, said: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(line)
    (advice,) = suggestions(_data([_row(f"{script}:1", "Tensor.item", 10, True, via)]),
                            synchronous=True)
    assert said in advice, advice
    assert ("host value" in advice) == ("hands" in said), advice


def test_times_a_step_counts_the_reads_in_steps_as_the_table_does(tmp_path: Path) -> None:
    # an accuracy read in training (4 a step) and in the evaluation after it: the table's 4.00
    script = tmp_path / "train.py"
    script.write_text("acc = accuracy(out, y)\n")
    rows = [_row(f"{script}:1", "Tensor.item", 40, True), _row(f"{script}:1", "Tensor.item", 40,
                                                                 False)]
    (said,) = suggestions(_data(rows), synchronous=True)
    assert "4 times a step (and 40 times outside the steps)" in said, said


def test_a_str_format_read_is_not_called_an_f_string(tmp_path: Path) -> None:
    script = tmp_path / "meter.py"
    script.write_text("    def __str__(self):\n        return self.fmt.format(**self.__dict__)\n")
    (said,) = suggestions(_data([_row(f"{script}:2", "Tensor.__format__", 10, True)]),
                          synchronous=True)
    assert said.startswith(f"{script}:2 formats a tensor with str.format() every step"), said
    assert "f'" not in said


def test_a_read_torch_makes_inside_a_call_on_the_line_is_said_as_such(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("writer.add_scalar('loss', loss, step)\n")
    (said,) = suggestions(_data([_row(f"{script}:1", "Tensor.cpu", 10, True)]), synchronous=True)
    assert said.startswith(f"{script}:1 hands a call a device value that torch's code reads on "
                           "the host (Tensor.cpu) every step"), said
    assert "the value" not in said


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


def test_a_read_outside_steps_shows_its_time_blocked_in_all_not_a_step_s() -> None:
    # (it blocked no step: 0.5 s over 10 steps would read as 50 ms a step)
    rows = [_row("t.py:9", "Tensor.item", 10, True, blocked_s=0.02),
            _row("t.py:30", "Tensor.item", 4, False, blocked_s=0.5)]
    lines = _sync_lines(rows)
    assert lines[1].endswith(" 2.00 ms/step") and "in all" not in lines[1]
    assert lines[2].endswith(" 500 ms in all  outside steps") and "/step" not in lines[2]


GLOSSARY_LINE = f'  the report\'s words: {GLOSSARY} ("Diagnose a script" in the docs)'

# -- collect() and text() from fake sources ----------------------------------------------------

SEEN = {"forwards": 0, "backwards": 0, "optimizer_steps": 0, "autograd_grad": 0,
        "other_threads": 0, "processes": 0}


def _stats(steps: int, wall_s: float, verdict: str = "synchronous",
           sections: dict[str, float | None] | None = None) -> Any:
    advice = ("too few steps to tell what limits the loop (a verdict needs 2 or more)"
              if verdict == "unknown" else "the loop body is the computation")
    flat = {"steps": steps, "wall_s": wall_s, "wait_fraction": 0.0, "fetch_s": 0.0,
            "body_s": wall_s}
    return SimpleNamespace(steps=steps, wall_s=wall_s, steps_per_s=steps / wall_s if wall_s else 0.0,
                           verdict=verdict, advice=advice, sections=sections,
                           as_dict=lambda: flat)


def _source(stats: Any, series: list[float | None],
            each: dict[str, list[float | None]] | None = None) -> Any:
    throttle = SimpleNamespace(stats=stats, synchronous=True)
    return SimpleNamespace(hooks=SimpleNamespace(throttle=throttle), framework=None,
                           steps=stats.steps, series=lambda: series, by_optimizer=lambda: each or {},
                           per_step=lambda: None)


def _steps(*sources: Any, **seen: int) -> Any:
    return SimpleNamespace(sources=list(sources), tail_reads=[], input_wait=0.0, loader=None,
                           error=None, seen={**SEEN, **seen})


def _report(steps: Any, rows: list[dict[str, Any]] | None = None,
            trace: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    data = collect(steps, rows if rows is not None else [], script="train.py", code=0,
                   argv=["train.py", "--lr", "0.1"])
    data["trace"] = trace
    return valid(data), text(data)


def test_the_json_keeps_its_fields_and_adds_seen_trace_files_and_where_the_loss_ended() -> None:
    nan = math.nan
    row = {**_row("train.py:5", "Tensor.item", 4, True), "file": "/abs/train.py"}
    data, _ = _report(_steps(_source(_stats(4, 2.0), [2.5, 1.5, None, nan]), forwards=4), [row])
    assert data["losses"] == [2.5, 1.5, None, None] and data["nonfinite"] == [3]
    assert data["last_nonfinite"] == "nan"
    assert data["seen"] == {**SEEN, "forwards": 4} and data["trace"] is None
    assert data["syncs"][0]["file"] == "/abs/train.py"
    # one optimizer: no losses_by_optimizer (its JSON as before)
    assert "losses_by_optimizer" not in data and "nonfinite_by_optimizer" not in data
    assert {"schema", "script", "argv", "exit_code", "steps", "steps_per_s", "losses", "nonfinite",
            "syncs", "verdict", "advice", "sections", "input_wait_s", "input_wait_fraction",
            "loader", "framework", "error", "stats", "suggestions"} <= data.keys()
    json.dumps(data, allow_nan=False)


def test_a_gan_s_optimizers_each_get_their_series_and_their_loss_line() -> None:
    each: dict[str, list[float | None]] = {"optimizer 0 (Adam)": [0.7, 0.6, 0.5],
                                           "optimizer 1 (Adam)": [2.0, math.inf, 3.0]}
    data, said = _report(_steps(_source(_stats(3, 1.0), [2.7, math.inf, 3.5], each)))
    assert data["losses_by_optimizer"] == {"optimizer 0 (Adam)": [0.7, 0.6, 0.5],
                                           "optimizer 1 (Adam)": [2.0, None, 3.0]}
    assert data["nonfinite_by_optimizer"] == {
        "optimizer 0 (Adam)": {"nonfinite": [], "last_nonfinite": None},
        "optimizer 1 (Adam)": {"nonfinite": [1], "last_nonfinite": None}}
    assert data["losses"] == [2.7, None, 3.5]
    loss_lines = [line for line in said.splitlines() if line.startswith("  loss:")]
    assert loss_lines == [
        "  loss: optimizer 0 (Adam): first 0.7, last 0.5, min 0.5 (step 2); no NaN/Inf",
        "  loss: optimizer 1 (Adam): first 2, last 3, min 2 (step 0); NaN/Inf at steps 1"]


def test_a_loss_that_ends_in_nan_is_last_nan_with_the_last_finite_named() -> None:
    _, said = _report(_steps(_source(_stats(4, 1.0), [2.0, 1.0, math.nan, math.nan])))
    assert ("  loss: first 2, last nan (the last finite 1 at step 1), min 1 (step 1); NaN/Inf at "
            "steps 2, 3") in said.splitlines()
    _, said = _report(_steps(_source(_stats(2, 1.0), [math.inf, None])))
    assert "  loss: last inf, none finite (NaN/Inf at steps 0)" in said.splitlines()


@pytest.mark.parametrize(("value", "shown"), [
    (1 / 24, "0.0417"), (0.0, "0"), (12.345, "12.3"), (1.0, "1.00"), (999.7, "1000"),
    (12345.0, "12300"), (0.0009996, "0.00100")])
def test_figures_have_3_significant_digits_and_no_exponent(value: float, shown: str) -> None:
    assert figure(value) == shown


def test_a_slow_step_s_rate_and_long_sections_read_right() -> None:
    # (in a step's order, whatever the order they were first timed in)
    stats = _stats(2, 48.0, sections={"backward": 12.34, "eval": None, "forward": 50_300.0,
                                      "tiny": 999.96})
    _, said = _report(_steps(_source(stats, [1.0, 0.5])))
    assert "2 steps in 48.00 s (0.0417 steps/s)" in said.splitlines()[0]
    assert ("  sections (median per step): forward 50.3 s, backward 12.3 ms, eval -, tiny 1.00 s;"
            in said)


def test_a_one_step_run_never_says_no_steps_yet() -> None:
    data, said = _report(_steps(_source(_stats(1, 0.5, verdict="unknown"), [1.0])))
    assert "no steps yet" not in said and "no steps yet" not in json.dumps(data)
    assert data["verdict"] == "unknown" and "too few steps to tell" in data["advice"]
    assert "python -m asyncthrottle run --trace trace.json train.py --lr 0.1" in said


@pytest.mark.parametrize(("seen", "why"), [
    ({}, "no training step found: the script never called backward() or an optimizer's step() "
         "(0 steps)"),
    ({"forwards": 3}, "no training step found: the script ran 3 training forwards but never "
                      "called backward() or an optimizer's step() (0 steps)"),
    ({"backwards": 2, "optimizer_steps": 1}, "no training step found: backward() was called 2 "
     "times and optimizers stepped 1 time, yet no step was recorded (0 steps)"),
    ({"other_threads": 9}, "no training step found on the main thread: 9 backward() or optimizer "
                           "step() calls ran on other threads (run hears only the main thread) "
                           "(0 steps)"),
    ({"autograd_grad": 4}, "no training step found: torch.autograd.grad was called 4 times (no "
                           "backward()) (0 steps)"),
    ({"processes": 2}, "no training step found: the script started 2 processes (mp.spawn, "
                       "multiprocessing), whose steps run does not hear: run each under run, "
                       "e.g. torchrun --nproc-per-node=2 -m asyncthrottle run train.py --lr 0.1 "
                       "with the script starting no processes of its own (0 steps)"),
])
def test_no_step_says_what_the_hooks_saw_and_offers_no_trace(seen: dict[str, int],
                                                              why: str) -> None:
    _, said = _report(_steps(**seen))
    assert f"  {why}" in said.splitlines()
    assert "trace" not in said


def _raised(kind: str | None, site: str | None, message: str | None,
            started: bool) -> dict[str, Any]:
    return {"type": kind, "site": site, "message": message, "started": started}


@pytest.mark.parametrize(("raised", "seen", "why"), [
    (_raised("SyntaxError", "train.py:3", "'(' was never closed", False), {},
     "the script did not start: SyntaxError at train.py:3: '(' was never closed (0 steps)"),
    # run found nothing to run (a package with no __main__): its own message said why
    (_raised(None, None, None, False), {}, "the script did not start (0 steps)"),
    (_raised("ModuleNotFoundError", "train.py:1", "No module named 'tiktok'", True), {},
     "no training step found: the script raised ModuleNotFoundError at train.py:1 before any "
     "step: No module named 'tiktok' (0 steps)"),
    # what the hooks saw still said, after the error
    (_raised("RuntimeError", "train.py:9", None, True), {"other_threads": 2},
     "no training step found on the main thread: the script raised RuntimeError at train.py:9 "
     "before any step; 2 backward() or optimizer step() calls ran on other threads (run hears "
     "only the main thread) (0 steps)"),
])
def test_a_script_that_raised_before_any_step_is_said_so_not_that_it_never_called_backward(
        raised: dict[str, Any], seen: dict[str, int], why: str) -> None:
    steps = _steps(**seen)
    data = collect(steps, [], script="train.py", code=1, argv=["train.py"], raised=raised)
    said = text(valid(data))
    assert f"  {why}" in said.splitlines() and "never called" not in said


@pytest.mark.parametrize(("steps", "trace", "said"), [
    (0, {"path": "t.json", "written": False}, "  no trace written (no steps)"),
    (2, {"path": "out dir/t.json", "written": True},
     "  the trace is in out dir/t.json: python -m asyncthrottle plot 'out dir/t.json'"),
])
def test_an_asked_for_trace_is_said_written_or_not_and_not_offered_again(
        steps: int, trace: dict[str, Any], said: str) -> None:
    sources = [_source(_stats(steps, 1.0), [1.0] * steps)] if steps else []
    _, shown = _report(_steps(*sources), trace=trace)
    # the glossary's line last (without --max-syncs-per-step)
    assert shown.splitlines()[-2:] == [said, GLOSSARY_LINE] and "--trace" not in shown


def test_the_sync_table_shows_the_top_20_in_steps_first_and_the_json_keeps_all() -> None:
    rows = [_row(f"t.py:{k}", "Tensor.item", 100 - k, True) for k in range(24)]
    rows.append(_row("t.py:99", "Tensor.item", 200, False))
    data, said = _report(_steps(_source(_stats(10, 1.0), [1.0] * 10)), rows)
    assert len(data["syncs"]) == 25
    lines = _sync_lines(data["syncs"])
    assert len(lines) == 22 and lines[-1] == "    ... and 5 more sites (all in --json)"
    assert lines[1].startswith("    t.py:0 ") and "t.py:99" not in said
    assert [line.split()[0] for line in lines[1:21]] == [f"t.py:{k}" for k in range(20)]


def test_more_than_20_suggestions_show_20_and_say_how_many_more(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("loss.item()\n" * 30)
    rows = [{**_row(f"t.py:{k}", "Tensor.item", 10, True), "file": str(script)}
            for k in range(1, 31)]
    data, said = _report(_steps(_source(_stats(10, 1.0), [1.0] * 10)), rows)
    assert len(data["suggestions"]) == 30
    assert "    20. t.py:" in said and "    21. " not in said
    assert "    ... and 10 more suggestions (all in --json)" in said


# -- suggestions: whose read, and what it reads ------------------------------------------------

MODEL = ("the model's own read in {via} (its forward's code, not the HF Trainer's nor the "
         "script's), so no TrainingArguments setting and no thr.defer moves it: it reads what the "
         "model was given (a mask, a length); see that line for the input or config that skips it")
HF_LOGS = ("the HF Trainer's own read, not the script's, so thr.defer cannot move it: raise "
           "TrainingArguments(logging_steps=) (it reads the loss and the grad norm it logs)")
LIGHTNING_LOGS = ("Lightning's own read, not the script's, so thr.defer cannot move it: log with "
                  "self.log(..., on_step=False)")
LIGHTNING_OTHER = ("Lightning's own read in {via}, not its logging (log_every_n_steps does not "
                   "move it) nor the script's, so thr.defer cannot move it: see that line for the "
                   "callback or Trainer setting that makes it")


@pytest.mark.parametrize(("via", "owner"), [
    ("transformers/masking_utils.py:329", MODEL),
    ("transformers/models/gpt2/modeling_gpt2.py:812", MODEL),
    ("transformers/modeling_utils.py:5120", MODEL),
    ("transformers/trainer_pt_utils.py:120", HF_LOGS),
    ("transformers/trainer.py:2257", HF_LOGS),
    ("lightning/pytorch/trainer/connectors/logger_connector/result.py:430", LIGHTNING_LOGS),
    ("pytorch_lightning/core/module.py:500", LIGHTNING_LOGS),
    ("lightning/pytorch/callbacks/model_checkpoint.py:380", LIGHTNING_OTHER),
])
def test_a_package_s_read_is_owned_by_the_file_that_made_it_not_the_package(
        via: str, owner: str) -> None:
    row = _row("hf.py:64", "Tensor.item", 10, True, via)
    said = suggestions(_data([row]), synchronous=True)[0]
    assert said.startswith(f"hf.py:64 calls {via.split('/')[0]}, whose {via} reads a device value "
                           f"(Tensor.item) every step: {owner.format(via=via)}")
    if owner is MODEL:
        assert "logging_nan_inf_filter" not in said and "logging_steps" not in said


def _said(tmp_path: Path, source: str, call: str, line: int = 2) -> str:
    script = tmp_path / "train.py"
    script.write_text(source)
    row = {**_row(f"train.py:{line}", call, 10, True), "file": str(script)}
    return suggestions(_data([row]), synchronous=True)[0].split(" every step")[0]


@pytest.mark.parametrize(("line", "call", "said"), [
    ("print(output.mean().item())", "Tensor.item", "calls output.mean().item()"),
    ("x = a.item() + b.item() + a.item()", "Tensor.item", "calls a.item() and b.item()"),
    ("total += float(loss) + float(aux['l1'])", "Tensor.__float__",
     "calls float(loss) and float(aux['l1'])"),
    ("idx = torch.nonzero(mask > 0)", "torch.nonzero", "calls torch.nonzero(mask > 0)"),
    ("idx = (mask > 0).nonzero()", "Tensor.nonzero", "calls (mask > 0).nonzero()"),
    ("kept = batch[0][keep]", "Tensor.__getitem__", "calls batch[0][mask]"),
    ("if (grad.norm() > 5) or stop: pass", "Tensor.__bool__",
     "branches on `if grad.norm() > 5 or stop:`"),
    ("log(f'{loss:.3f}')", "Tensor.__format__", "calls f'{loss}'"),
])
def test_a_read_names_what_its_line_reads_as_written(tmp_path: Path, line: str, call: str,
                                                     said: str) -> None:
    assert _said(tmp_path, f"import torch\n{line}\n", call) == f"train.py:2 {said}"


def test_two_reads_on_a_line_are_both_deferred(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = a.item() + b.item()\n")
    row = {**_row("train.py:2", "Tensor.item", 10, True), "file": str(script)}
    assert suggestions(_data([row]), synchronous=True)[0].endswith(
        "every step: thr.defer((a, b)) instead, or read it every 50 steps" + SYNC)


def test_a_read_spread_over_lines_is_found_from_any_of_them(tmp_path: Path) -> None:
    source = "import torch\nvalue = (output\n         .sum()\n         .item())\n"
    assert _said(tmp_path, source, "Tensor.item", 4) == "train.py:4 calls output.sum().item()"


def test_the_receiver_is_read_from_the_site_s_own_file_from_another_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the display path, train.py, names another file in the working directory
    (elsewhere / "train.py").write_text("import torch\nwrong.item()\n")
    monkeypatch.chdir(elsewhere)
    mine = tmp_path / "mine"
    mine.mkdir()
    assert _said(mine, "import torch\nright.item()\n", "Tensor.item") == (
        "train.py:2 calls right.item()")


def test_a_file_that_no_longer_parses_falls_back_to_the_line_s_text(tmp_path: Path) -> None:
    assert _said(tmp_path, "def (:\nprint(loss.item())\n", "Tensor.item") == (
        "train.py:2 calls loss.item()")
    (tmp_path / "other").mkdir()
    assert _said(tmp_path / "other", "def (:\nprint(3)\n", "Tensor.item") == (
        "train.py:2 calls the value.item()")


# -- the time blocked: what a fix can recover ----------------------------------------------------


def _ahead(rows: list[dict[str, Any]], *, step_ms: float = 10.0,
           device_ms: float | None = None) -> dict[str, Any]:
    """A report of 10 steps of ``step_ms`` each on a device that runs ahead (``device_ms`` a
    step where its steps were timed)."""
    stats = {"wall_s": step_ms / 100, **({"device_ms_mean": device_ms} if device_ms else {})}
    return _data(rows, steps=10, stats=stats, verdict="balanced")


def _read_rows() -> list[dict[str, Any]]:
    """In the report's order, by count a step: a frequent read that blocks little, an untimed
    one, a rare one that blocks long."""
    return [_row("t.py:3", "Tensor.item", 30, True, blocked_s=0.001),  # 0.1 ms a step
            _row("t.py:5", "Tensor.item", 20, True),
            _row("t.py:9", "Tensor.item", 10, True, blocked_s=0.02)]  # 2 ms a step


def test_reads_are_ranked_by_time_blocked_where_the_device_runs_ahead_else_by_count() -> None:
    ahead = suggestions(_ahead(_read_rows()), synchronous=False)
    assert [said.split()[0] for said in ahead] == ["t.py:9", "t.py:3", "t.py:5"]
    synchronous = suggestions(_ahead(_read_rows()), synchronous=True)
    assert [said.split()[0] for said in synchronous] == ["t.py:3", "t.py:5", "t.py:9"]
    assert not any("recovers" in said for said in synchronous)


@pytest.mark.parametrize(("device_ms", "said"), [
    (None, "a fix recovers at most 2.00 ms a step (20% of the step), the time it blocks"),
    (9.5, "a fix recovers at most 0.500 ms a step (5% of the step): it blocks 2.00 ms a step, "
          "but the device is busy 9.50 ms of the 10.0 ms step"),
    (12.0, "a fix recovers at most 0 ms a step (0% of the step): it blocks 2.00 ms a step, but "
           "the device is busy 12.0 ms of the 10.0 ms step"),
    (7.0, "a fix recovers at most 2.00 ms a step (20% of the step), the time it blocks"),
])
def test_a_read_s_suggestion_says_what_a_fix_recovers_at_most(device_ms: float | None,
                                                              said: str) -> None:
    rows = _read_rows()
    data = _ahead(rows, device_ms=device_ms)
    assert suggestions(data, synchronous=False)[0].endswith(f"; {said}")
    assert suggestions(data, synchronous=False)[2].endswith(
        "; a fix recovers at most the time the read blocks (not timed)")
    assert recovers(rows[1], data, synchronous=False) is None
    assert recovers(rows[2], data, synchronous=True) is None


@pytest.mark.parametrize("device_ms", [None, 0.5, 5.0, 9.9, 10.0, 50.0])
@pytest.mark.parametrize("blocked_ms", [0.0, 0.01, 1.0, 9.0, 10.0])
def test_what_a_fix_recovers_never_exceeds_the_time_blocked(device_ms: float | None,
                                                            blocked_ms: float) -> None:
    row = _row("t.py:9", "Tensor.item", 10, True, blocked_s=blocked_ms / 100)
    data = _ahead([row], device_ms=device_ms)
    most = recovers(row, data, synchronous=False)
    assert most is not None and 0 <= most <= row["blocked_per_step_s"]
    if device_ms is not None:
        assert most <= max(0.0, (10.0 - device_ms) / 1000)
    promised = re.search(r"recovers at most ([\d.]+) ms a step", suggestions(
        data, synchronous=False)[0])
    assert promised is not None and float(promised.group(1)) <= float(figure(blocked_ms))


def test_the_sync_table_gives_the_time_blocked_a_step_where_timed() -> None:
    rows = [_row("t.py:3", "Tensor.item", 30, True, blocked_s=0.0012),
            _row("t.py:5", "Tensor.__bool__", 20, True)]
    assert _sync_lines(rows) == [
        "  sync sites (site    call             count  per step        blocked):",
        "    t.py:3  Tensor.item         30      3.00  0.120 ms/step",
        "    t.py:5  Tensor.__bool__     20      2.00              -",
    ]
    assert "blocked" not in _sync_lines([rows[1]])[0]


SEEN = {"forwards": 0, "backwards": 0, "optimizer_steps": 0, "autograd_grad": 0,
        "other_threads": 0, "processes": 0}


def test_a_jax_script_is_told_run_hears_pytorch_only_and_the_jax_path() -> None:
    jax = {**SEEN, "jax": 1}
    assert "run hears PyTorch only" in nothing_found(jax, ["train.py"])
    assert "device=\"jax\"" in nothing_found(jax, ["train.py"])
    assert _sync_lines([], jax) == [
        "  sync sites: not counted: run hears PyTorch's reads only, not JAX's (a float(loss) of "
        "a JAX array is a sync it does not see)"]
    # a torch script that imports JAX too, and trains torch: its table is its own
    both = {**jax, "backwards": 3}
    assert _sync_lines([], both) == ["  sync sites: no host reads of device values by the script"]
    assert "JAX" not in nothing_found(both, ["train.py"])


@pytest.mark.slow
def test_a_jax_loop_under_run_is_not_told_it_makes_no_host_reads(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    # a process of its own: the script imports JAX, which the tests' process must not
    done, report = under_run("jax_loop.py", tmp_path, preload=())
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert report["seen"]["jax"] == 1 and report["syncs"] == []
    err = done.stderr.decode()
    assert "run hears PyTorch only" in err and "no host reads" not in err


def _synchronous(synchronous: bool) -> Any:
    source = _source(_stats(10, 1.0), [1.0] * 10)
    source.hooks.throttle.synchronous = synchronous
    return source


def test_a_synchronous_device_s_report_says_once_why_a_fix_pays_on_an_accelerator() -> None:
    rows = [_row("train.py:5", "Tensor.item", 10, True, blocked_s=0.001),
            _row("train.py:7", "Tensor.__float__", 10, True, blocked_s=0.002)]
    data, said = _report(_steps(_synchronous(True)), rows)
    assert data["synchronous"] is True and len(data["suggestions"]) == 2
    assert said.count("on an accelerator") == 1
    note = ("  this device runs each op as it is issued (the CPU): a read here waits for nothing, "
            "so its time blocked does not show what it costs; on an accelerator each read in the "
            "steps waits for the device to finish the work queued before it (a sync), and a fix "
            "recovers that wait: measure it there")
    lines = said.splitlines()
    # under the sync table, whose "blocked" column it explains
    assert lines[lines.index(note) - 1].startswith("    train.py:7")
    assert not any("recovers" in line for line in data["suggestions"])


def test_no_note_runs_ahead_or_without_a_read_in_the_steps() -> None:
    rows = [_row("train.py:5", "Tensor.item", 10, True, blocked_s=0.001)]
    data, said = _report(_steps(_synchronous(False)), rows)
    assert data["synchronous"] is False and "this device runs each op" not in said
    assert "a fix recovers at most" in data["suggestions"][0]
    outside = [_row("train.py:9", "Tensor.item", 1, False)]
    data, said = _report(_steps(_synchronous(True)), outside)
    assert "this device runs each op" not in said
    data, _ = _report(_steps())
    assert "synchronous" not in data


def _many_reads(folder: Path, reads: int) -> list[dict[str, Any]]:
    """A script whose loop reads the loss on ``reads`` lines (half printed, which --suggest may
    rewrite, half assigned), and the audit's rows for it (10 steps)."""
    lines = ["import torch", "model = torch.nn.Linear(2, 1)", "for x in torch.randn(10, 2):",
             "    loss = model(x).sum()", "    loss.backward()"]
    lines += ["    print(loss.item())" if k % 2 else f"    value{k} = loss.item()"
              for k in range(reads)]
    path = folder / f"reads{reads}.py"
    path.write_text("\n".join(lines) + "\n")
    rows = [{**_row(f"{path.name}:{line}", "Tensor.item", 10, True), "file": str(path)}
            for line in range(6, 6 + reads)]
    return _syncs(rows, [], 10)


def _ast_work(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], root: Path
              ) -> tuple[int, int, int]:
    """What the report's per-site work (each row's receivers for its suggestion, the patches of
    --suggest) costs in ``ast``: parses of the whole file, walks of the whole file's tree, and
    nodes visited (``ast.iter_child_nodes`` calls: every walk and traversal makes them)."""
    import ast

    from asyncthrottle.run import receivers as found
    from asyncthrottle.run.patchfile import patches

    source = Path(rows[0]["file"]).read_text()
    counts = {"parses": 0, "walks": 0, "visits": 0}
    parse, walk, children = ast.parse, ast.walk, ast.iter_child_nodes

    def counting_parse(text: Any, *args: Any, **kwargs: Any) -> Any:
        counts["parses"] += isinstance(text, str) and len(text) >= len(source)
        return parse(text, *args, **kwargs)

    def counting_walk(node: Any) -> Any:
        counts["walks"] += isinstance(node, ast.Module)
        return walk(node)

    def counting_children(node: Any) -> Any:
        counts["visits"] += 1
        return children(node)

    monkeypatch.setattr(ast, "parse", counting_parse)
    monkeypatch.setattr(ast, "walk", counting_walk)
    monkeypatch.setattr(ast, "iter_child_nodes", counting_children)
    for row in rows:
        found.receivers(row, "item")
    entries, patch = patches(rows, str(root))
    monkeypatch.undo()
    assert len(entries) == len(rows) and patch  # the work was done: suggestions, diffs
    assert sum(entry["certain"] for entry in entries) == len(rows) // 2
    return counts["parses"], counts["walks"], counts["visits"]


def test_the_report_parses_and_walks_a_file_once_however_many_sites_it_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#56: each site walked the file's tree (the report took 24 s for 1,000 sites). Counted, not
    timed: the file is parsed and walked a fixed number of times (the index of the rows'
    functions and texts, the rewrite's, the whole patch's check), and the nodes visited grow
    with the sites, not with their square."""
    small, large = _many_reads(tmp_path, 60), _many_reads(tmp_path, 240)
    first = next(row for row in small if row["site"] == "reads60.py:6")
    assert (first["function"], first["text"]) == ("<module>", "value0 = loss.item()")
    few, many = _ast_work(monkeypatch, small, tmp_path), _ast_work(monkeypatch, large, tmp_path)
    assert few[:2] == many[:2] and many[0] <= 3 and many[1] <= 3
    # 4 times the sites: about 4 times the visits (16 times where each site walks the file)
    assert many[2] < 4.5 * few[2]
