"""``python -m asyncthrottle compare BEFORE.json AFTER.json``: the speed, the sync sites removed,
added, changed and moved?, the verdicts, whether the losses agree, the two ``--fail-*`` rules,
``--json OUT``, and a clear error for each file that is no run report."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _runs import SCRIPTS, found_syncs, read_report, said_syncs, start, valid

from asyncthrottle.__main__ import main as cli
from asyncthrottle.run.compare import FAILED, UNUSABLE, main, more_often


def _row(site: str, call: str, count: int, steps: int, in_step: bool = True,
         via: str | None = None) -> dict[str, Any]:
    return {"site": site, "call": call, "count": count, "per_step": count / steps,
            "in_step": in_step, "via": via, "file": f"/abs/{site.rpartition(':')[0]}"}


def _report(steps: int = 8, steps_per_s: float = 100.0, losses: list[float | None] | None = None,
            syncs: list[dict[str, Any]] | None = None, script: str = "train.py",
            verdict: str = "synchronous") -> dict[str, Any]:
    """A report of run's shape (as loader_loop.py's, cut down), validated."""
    return valid({
        "schema": 1, "script": script, "argv": [script], "exit_code": 0, "steps": steps,
        "steps_per_s": steps_per_s,
        "losses": [1.0 / (k + 1) for k in range(steps)] if losses is None else losses,
        "nonfinite": [], "last_nonfinite": None,
        "syncs": [_row("train.py:25", "Tensor.item", steps, steps)] if syncs is None else syncs,
        "verdict": verdict, "advice": "the advice", "sections": {"forward": 0.35, "backward": 0.65},
        "input_wait_s": 0.002, "input_wait_fraction": 0.05,
        "loader": {"num_workers": 0, "pin_memory": False, "pin_memory_in_effect": False,
                   "pin_memory_off": None, "batch_size": 6, "batched_by": None},
        "framework": None, "error": None,
        "stats": {"steps": steps, "wall_s": steps / steps_per_s if steps_per_s else 0.0,
                  "steps_per_s": steps_per_s, "verdict": verdict, "in_flight_hist_0": 0},
        "seen": {"forwards": steps, "backwards": steps, "optimizer_steps": steps,
                 "autograd_grad": 0, "other_threads": 0, "processes": 0},
        "trace": None, "suggestions": []})


def _files(tmp_path: Path, before: Any, after: Any) -> tuple[str, str]:
    paths = []
    for name, data in (("before.json", before), ("after.json", after)):
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        paths.append(str(path))
    return paths[0], paths[1]


def _compare(tmp_path: Path, before: Any, after: Any, *flags: str) -> tuple[int, dict[str, Any]]:
    """``compare`` run in-process with ``--json``: its exit status and its JSON."""
    out = tmp_path / "out.json"
    code = main([*_files(tmp_path, before, after), "--json", str(out), *flags])
    return code, json.loads(out.read_text())


def test_the_speed_its_ratio_and_the_verdicts(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _report(steps_per_s=80.0),
                           _report(steps_per_s=100.0, verdict="input-bound"))
    said = capsys.readouterr()
    assert code == 0 and said.err == ""
    assert found["speed_ratio"] == pytest.approx(1.25) and found["verdict_changed"]
    assert (found["before"]["steps_per_s"], found["after"]["steps_per_s"]) == (80.0, 100.0)
    lines = said.out.splitlines()
    assert lines[0] == f"asyncthrottle compare: {tmp_path / 'before.json'} -> " \
                       f"{tmp_path / 'after.json'} (train.py)"
    assert lines[1] == "  speed: 80.0 -> 100 steps/s (x1.25, +25%); steps 8 -> 8"
    assert lines[2] == "  verdict: synchronous -> input-bound"
    assert "  sync sites: no change (1 the same)" in lines


def test_sites_removed_added_changed_and_moved_by_their_key(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    before = _report(syncs=[_row("train.py:25", "Tensor.item", 8, 8),
                            _row("train.py:26", "Tensor.item", 8, 8),
                            _row("train.py:40", "Tensor.__float__", 2, 8, in_step=False),
                            _row("train.py:50", "Tensor.tolist", 1, 8, in_step=False),
                            _row("train.py:60", "Tensor.item", 8, 8,
                                 via="transformers/trainer.py:2257"),
                            _row("train.py:70", "Tensor.cpu", 1, 8, in_step=False)])
    after = _report(syncs=[_row("train.py:30", "Tensor.__bool__", 16, 8),
                           _row("train.py:40", "Tensor.__float__", 4, 8, in_step=False),
                           _row("train.py:49", "Tensor.tolist", 1, 8, in_step=False),
                           # the same site and call as a framework's read before: the line's own
                           _row("train.py:60", "Tensor.item", 8, 8),
                           _row("train.py:70", "Tensor.cpu", 1, 8, in_step=False)])
    code, found = _compare(tmp_path, before, after)
    assert code == 0
    changes = [(c["change"], (c["before"] or {}).get("site"), (c["after"] or {}).get("site"),
                c["call"], c["via"], c["in_step"]) for c in found["syncs"]["changes"]]
    item, via = "Tensor.item", "transformers/trainer.py:2257"
    assert changes == [
        ("added", None, "train.py:30", "Tensor.__bool__", None, True),
        # two in-step Tensor.item sites of train.py gone and one new: no pair is certain
        ("removed", "train.py:25", None, item, None, True),
        ("removed", "train.py:26", None, item, None, True),
        # a framework's read and the line's own read at one site are two keys (via)
        ("removed", "train.py:60", None, item, via, True),
        ("added", None, "train.py:60", item, None, True),
        ("changed", "train.py:40", "train.py:40", "Tensor.__float__", None, False),
        # the only tolist of train.py outside steps gone, and the only new one: moved?
        ("moved?", "train.py:50", "train.py:49", "Tensor.tolist", None, False)]
    assert found["syncs"]["unchanged"] == 1
    assert found["syncs"]["changes"][5]["after"] == {"site": "train.py:40", "count": 4,
                                                     "per_step": 0.5}
    out = capsys.readouterr().out
    assert "  sync sites (3 removed, 2 added, 1 changed, 1 moved?; 1 the same):" in out
    table = out[out.index("    change"):].splitlines()
    assert table[0].split() == ["change", "site", "call", "before", "after"]
    assert table[1].split() == ["added", "train.py:30", "Tensor.__bool__", "-", "16,", "2.00/step"]
    assert table[4].split()[:4] == ["removed", "train.py:60", "Tensor.item", "(in"]
    assert f"Tensor.item (in {via})" in table[4]
    assert table[7].split() == ["moved?", "train.py:50", "->", "train.py:49", "Tensor.tolist",
                                "1,", "0.12/step", "1,", "0.12/step", "outside", "steps"]


def _named(site: str, call: str, count: int, steps: int, text: str, function: str = "<module>",
           in_step: bool = True) -> dict[str, Any]:
    """A row as run writes it since #56: with the enclosing function and the line's text."""
    return {**_row(site, call, count, steps, in_step), "function": function, "text": text}


def test_sites_are_matched_by_what_they_are_not_by_their_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A patch inserts 12 lines above the loop and removes one read: every later read moved,
    and each is the same read (call, function, text); one read's line now holds another read."""
    print_loss = 'print(f"loss {loss.item():.4f}")'
    before = _report(syncs=[
        _named("train.py:10", "Tensor.item", 1, 8, "scale = w.norm().item()", in_step=False),
        _named("train.py:20", "Tensor.item", 8, 8, "g = grad.norm().item()", "train"),
        _named("train.py:22", "Tensor.item", 8, 8, print_loss, "train"),
        _named("train.py:24", "Tensor.__bool__", 8, 8, "if loss > 9:", "train"),
        _named("train.py:30", "Tensor.item", 8, 8, "g = grad.norm().item()", "train"),
        _named("train.py:34", "Tensor.item", 8, 8, "m = x.max().item()", "train"),
        _named("train.py:40", "Tensor.__float__", 1, 8, "print(float(total))", in_step=False)])
    after = _report(syncs=[
        _named("train.py:10", "Tensor.item", 1, 8, "scale = w.norm().item()", in_step=False),
        _named("train.py:32", "Tensor.item", 8, 8, "g = grad.norm().item()", "train"),
        _named("train.py:35", "Tensor.__bool__", 8, 8, "if loss > 9:", "train"),
        _named("train.py:41", "Tensor.item", 8, 8, "g  =  grad.norm().item()", "train"),
        # line 34 of BEFORE's file is another read now: not the same site
        _named("train.py:34", "Tensor.item", 8, 8, "n = x.min().item()", "train"),
        _named("train.py:45", "Tensor.item", 16, 8, "m = x.max().item()", "train"),
        _named("train.py:51", "Tensor.__float__", 1, 8, "print(float(total))", in_step=False)])
    code, found = _compare(tmp_path, before, after, "--fail-on-new-syncs")
    changes = [(c["change"], (c["before"] or {}).get("site"), (c["after"] or {}).get("site"))
               for c in found["syncs"]["changes"]]
    assert changes == [("changed", "train.py:34", "train.py:45"),
                       ("removed", "train.py:22", None), ("added", None, "train.py:34")]
    # two reads of one text in one function pair in line order (its whitespace is no matter)
    assert found["syncs"]["unchanged"] == 5
    assert [(m["before"], m["after"]) for m in found["syncs"]["moved"]] == [
        ("train.py:20", "train.py:32"), ("train.py:24", "train.py:35"),
        ("train.py:30", "train.py:41"), ("train.py:40", "train.py:51")]
    assert code == FAILED and found["rules"][0]["why"] == [
        "train.py:45 Tensor.item (train.py:34 BEFORE) reads more often in steps: 16 in 8 steps, "
        "2.00 a step, BEFORE 8 in 8 steps, 1.00 a step",
        "train.py:34 Tensor.item reads in steps (8 in 8 steps, 1.00 a step), a site BEFORE did "
        "not read in steps"]
    out = capsys.readouterr().out
    assert ("  sync sites (1 removed, 1 added, 1 changed; 5 the same, 4 of them at another "
            "line):") in out
    assert "    changed  train.py:34 -> train.py:45  Tensor.item" in out
    # the same text in another function is another read
    moved = [{**row, "function": "evaluate"} if row["site"] == "train.py:32" else row
             for row in after["syncs"]]
    code, found = _compare(tmp_path, before, {**after, "syncs": moved})
    assert ("added", None, "train.py:32") in [
        (c["change"], (c["before"] or {}).get("site"), (c["after"] or {}).get("site"))
        for c in found["syncs"]["changes"]]


def test_a_report_without_the_lines_text_is_matched_by_its_sites(tmp_path: Path) -> None:
    """An older report (no ``text``) against a new one: the sites alone tell a read, and the
    only gone and new site of a kind are ``moved?``."""
    before = _report(syncs=[_row("train.py:22", "Tensor.item", 8, 8),
                            _row("train.py:30", "Tensor.cpu", 8, 8)])
    after = _report(syncs=[_named("train.py:22", "Tensor.item", 8, 8, "x = y.item()"),
                           _named("train.py:33", "Tensor.cpu", 8, 8, "z = w.cpu()")])
    code, found = _compare(tmp_path, before, after, "--fail-on-new-syncs")
    assert code == 0 and found["syncs"]["unchanged"] == 1 and found["syncs"]["moved"] == []
    assert [c["change"] for c in found["syncs"]["changes"]] == ["moved?"]


def test_runs_that_are_not_alike_fail_every_rule_and_are_said_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # AFTER crashed after 2 of 6 steps: faster, and no new read
    crashed = _report(steps=2, steps_per_s=300.0)
    crashed["exit_code"] = 1
    code, found = _compare(tmp_path, _report(steps=6), crashed, "--fail-on-new-syncs",
                           "--fail-if-slower", "5")
    unlike = ["AFTER's script exited 1 (it failed: its figures are of a run cut short)",
              "AFTER found 2 steps, fewer than BEFORE's 6 (it stopped early, or ran less)"]
    assert code == FAILED and found["unlike"] == unlike
    assert [(rule["passed"], rule["why"][:2]) for rule in found["rules"]] == [(False, unlike)] * 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"  NOT ALIKE: {'; '.join(unlike)}: the figures below compare unlike " \
                       "runs, and no rule can pass"
    assert lines[2].startswith("  speed: 100 -> 300 steps/s (x3.00, +200%)")
    # AFTER found no step at all
    code, found = _compare(tmp_path, _report(), _report(steps=0, steps_per_s=0.0, syncs=[]),
                           "--fail-on-new-syncs")
    assert code == FAILED and found["rules"][0]["why"][0] == "AFTER found no training step"
    # BEFORE failed: no baseline
    failed = _report()
    failed["exit_code"] = 3
    code, found = _compare(tmp_path, failed, _report(), "--fail-if-slower", "5")
    assert code == FAILED and found["unlike"] == [
        "BEFORE's script exited 3 (it failed: its figures are of a run cut short)"]
    # no rule asked: said, and compared
    capsys.readouterr()
    code, found = _compare(tmp_path, failed, _report())
    assert code == 0 and capsys.readouterr().out.splitlines()[1] == (
        "  NOT ALIKE: BEFORE's script exited 3 (it failed: its figures are of a run cut short): "
        "the figures below compare unlike runs")


@pytest.mark.parametrize(("text", "said"), [
    ('"steps_per_s": NaN', "holds NaN (JSON has no NaN; a report writes null for a value that "
                           "is not finite), which no run report holds"),
    ('"steps_per_s": Infinity', "holds Infinity"),
    ('"steps_per_s": -Infinity', "holds -Infinity"),
    ('"steps_per_s": 1e999', "holds the number 1e999 (beyond a float's range)"),
    ('"steps": ' + "9" * 5000, "holds the integer 99999999999999999999... (5000 digits) (beyond "
                                "64 bits)"),
    ('"steps": 9223372036854775808', "holds the integer 9223372036854775808 (beyond 64 bits)"),
])
def test_a_number_no_report_holds_is_refused(tmp_path: Path, text: str, said: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    good = json.dumps(_report())
    key = text.partition(":")[0]
    start = good.index(key + ": ")
    bad = good[:start] + text + good[good.index(",", start):]
    assert main(list(_files(tmp_path, _report(), bad))) == UNUSABLE
    out, err = capsys.readouterr()
    assert out == "" and f"AFTER {str(tmp_path / 'after.json')!r} {said}" in err
    assert "Traceback" not in err


def test_json_nested_too_deep_is_refused(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(list(_files(tmp_path, "[" * 100_000 + "]" * 100_000, _report()))) == UNUSABLE
    err = capsys.readouterr().err
    assert "BEFORE" in err and "is JSON nested too deep to read" in err


def test_equal_and_differing_losses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _report(), _report())
    assert found["losses"] == {"agree": "equal", "before_steps": 8, "after_steps": 8,
                               "compared_steps": 8, "max_abs_diff": 0.0, "at_step": 0,
                               "null_in_one": []}
    assert "  loss: equal (8 steps)" in capsys.readouterr().out
    before = _report(steps=4, losses=[2.0, 1.5, None, 1.0])
    after = _report(steps=5, losses=[2.0, 1.25, 0.5, 1.0, 0.75])
    code, found = _compare(tmp_path, before, after)
    assert code == 0
    assert found["losses"] == {"agree": "differ", "before_steps": 4, "after_steps": 5,
                               "compared_steps": 4, "max_abs_diff": 0.25, "at_step": 1,
                               "null_in_one": [2]}
    line = next(line for line in capsys.readouterr().out.splitlines() if "loss:" in line)
    assert line == ("  loss: differ (4 steps before, 5 after): largest difference 0.25 at step 1 "
                    "(1.5 -> 1.25) over 4 common steps; a loss in one only (null in the other) "
                    "at steps 2")


def test_more_often_is_a_higher_rate_that_another_step_count_cannot_make() -> None:
    assert more_often(8, 8, 9, 8) and not more_often(8, 8, 8, 8)
    # a read every 10 steps: 10 in 100 steps, 5 in 41 (4.1 at the same rate, plus the rounding)
    assert not more_often(10, 100, 5, 41)
    # once, at the first step, whatever the steps
    assert not more_often(1, 100, 1, 50)
    # every step before, twice a step after, with another step count
    assert not more_often(100, 100, 50, 50) and more_often(100, 100, 100, 50)
    # no steps before: the count alone
    assert more_often(0, 0, 1, 5) and not more_often(2, 0, 2, 5)


def test_fail_on_new_syncs_fails_for_a_new_or_more_frequent_read_in_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _report(syncs=[_row("train.py:25", "Tensor.item", 8, 8),
                            _row("train.py:40", "Tensor.cpu", 8, 8),
                            _row("train.py:50", "Tensor.tolist", 1, 8, in_step=False)])
    after = _report(syncs=[_row("train.py:25", "Tensor.item", 16, 8),
                           _row("train.py:39", "Tensor.cpu", 24, 8),
                           _row("train.py:31", "Tensor.__bool__", 1, 8),
                           # outside steps: never the rule's
                           _row("train.py:50", "Tensor.tolist", 9, 8, in_step=False)])
    code, found = _compare(tmp_path, before, after, "--fail-on-new-syncs")
    assert code == FAILED == 1
    rule = found["rules"][0]
    assert (rule["rule"], rule["passed"]) == ("--fail-on-new-syncs", False)
    assert rule["why"] == [
        "train.py:39 Tensor.cpu (moved? from train.py:40) reads more often in steps: 24 in 8 "
        "steps, 3.00 a step, BEFORE 8 in 8 steps, 1.00 a step",
        "train.py:25 Tensor.item reads more often in steps: 16 in 8 steps, 2.00 a step, BEFORE "
        "8 in 8 steps, 1.00 a step",
        "train.py:31 Tensor.__bool__ reads in steps (1 in 8 steps, 0.12 a step), a site BEFORE "
        "did not read in steps"]
    out = capsys.readouterr().out
    assert f"  --fail-on-new-syncs: FAILED: {rule['why'][0]}\n    {rule['why'][1]}" in out


def test_fail_on_new_syncs_passes_for_fewer_reads_and_another_step_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _report(steps=41, syncs=[_row("train.py:25", "Tensor.item", 41, 41),
                                      _row("train.py:30", "Tensor.__bool__", 5, 41)])
    # item gone; the every-10-steps branch reads 10 times in 100 steps; a read moved outside
    after = _report(steps=100, syncs=[_row("train.py:30", "Tensor.__bool__", 10, 100),
                                      _row("train.py:70", "Tensor.item", 1, 100, in_step=False)])
    code, found = _compare(tmp_path, before, after, "--fail-on-new-syncs")
    assert code == 0 and found["rules"][0]["passed"] and found["exit_code"] == 0
    assert ("  --fail-on-new-syncs: passed: no site reads in steps where BEFORE did not, nor more "
            "often") in capsys.readouterr().out


def test_fail_on_new_syncs_cannot_check_without_counts(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    before = _report()
    before["syncs"] = None
    code, found = _compare(tmp_path, before, _report(), "--fail-on-new-syncs")
    assert code == FAILED and found["syncs"] is None
    out = capsys.readouterr().out
    assert "  sync sites: not compared (BEFORE counted none: syncs is null)" in out
    assert "--fail-on-new-syncs: FAILED: cannot check: BEFORE counted no sync sites" in out


def test_fail_if_slower_fails_beyond_its_percent_and_passes_within(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _report(steps_per_s=200.0), _report(steps_per_s=180.0),
                           "--fail-if-slower", "5")
    assert code == FAILED and found["rules"][0]["rule"] == "--fail-if-slower 5"
    assert ("  --fail-if-slower 5: FAILED: AFTER 180 steps/s against BEFORE 200: 10.0% slower, "
            "more than the 5% allowed") in capsys.readouterr().out
    code, found = _compare(tmp_path, _report(steps_per_s=200.0), _report(steps_per_s=195.0),
                           "--fail-if-slower", "5")
    assert code == 0 and found["rules"][0]["why"] == [
        "AFTER 195 steps/s against BEFORE 200: 2.5% slower"]
    code, found = _compare(tmp_path, _report(steps_per_s=200.0), _report(steps_per_s=250.0),
                           "--fail-if-slower", "0")
    assert code == 0 and found["rules"][0]["why"][0].endswith("25.0% faster")
    # no steps before: nothing to compare the speed with
    code, found = _compare(tmp_path, _report(steps=0, steps_per_s=0.0, syncs=[]), _report(),
                           "--fail-if-slower", "5")
    assert code == FAILED and found["rules"][0]["why"] == [
        "BEFORE found no training step", "cannot check: BEFORE found no steps (0 steps/s), so "
        "there is no speed to compare with"]
    assert found["speed_ratio"] is None
    assert "(no ratio: BEFORE found no steps)" in capsys.readouterr().out


def test_both_rules_failing_are_both_said(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    after = _report(steps_per_s=50.0, syncs=[_row("train.py:25", "Tensor.item", 16, 8)])
    code, found = _compare(tmp_path, _report(), after, "--fail-on-new-syncs",
                           "--fail-if-slower", "10")
    assert code == FAILED and [rule["passed"] for rule in found["rules"]] == [False, False]
    out = capsys.readouterr().out
    assert "--fail-on-new-syncs: FAILED" in out and "--fail-if-slower 10: FAILED" in out


@pytest.mark.parametrize("pct", ["-1", "abc", "nan"])
def test_a_bad_percent_is_a_usage_error(tmp_path: Path, pct: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*_files(tmp_path, _report(), _report()), "--fail-if-slower", pct])
    assert exited.value.code == 2
    assert f"--fail-if-slower takes a percent >= 0 (5 fails AFTER more than 5% slower), got " \
           f"{pct!r}" in capsys.readouterr().err


_SCHEMA_2 = json.dumps({"schema": 2, "steps": 3})


@pytest.mark.parametrize(("after", "said"), [
    (None, "does not exist: pass the file python -m asyncthrottle run --json PATH SCRIPT wrote"),
    ("asyncthrottle run: train.py: 8 steps", "is not JSON (Expecting value: line 1 column 1"),
    ("[1, 2]", 'is JSON but not a run report (no "schema" key): pass the file'),
    ('{"steps": 3}', 'is JSON but not a run report (no "schema" key)'),
    ('{"traceEvents": []}', "is a trace (run --trace), not a report: pass the file"),
    (_SCHEMA_2, "has schema 2, and asyncthrottle "),
    ('{"schema": true}', "has schema True"),
    ("folder", "is a folder: pass the file"),
])
def test_a_file_that_is_no_run_report_is_a_clear_error(tmp_path: Path, after: str | None,
                                                       said: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    before_path, after_path = _files(tmp_path, _report(), "{}")
    Path(after_path).unlink()
    if after == "folder":
        Path(after_path).mkdir()
    elif after is not None:
        Path(after_path).write_text(after)
    assert main([before_path, after_path]) == UNUSABLE == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"python -m asyncthrottle compare: AFTER {after_path!r} ")
    assert said in err
    if after == _SCHEMA_2:
        assert "reads schema 1: compare it with the asyncthrottle that wrote it, or run the " \
               "script again under this one" in err


def test_a_report_of_the_wrong_shape_names_what_is_wrong(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = _report()
    broken["steps"] = "8"
    del broken["syncs"][0]["call"]
    assert main(list(_files(tmp_path, broken, _report()))) == UNUSABLE
    err = capsys.readouterr().err
    assert f"BEFORE {str(tmp_path / 'before.json')!r} is not a run report of schema 1 (" in err
    assert "at $.steps: '8' is not of type integer" in err
    assert "at $.syncs[0]: the required field 'call' is missing" in err
    assert err.rstrip().endswith("wrote, unchanged")


def test_reports_of_different_scripts_are_compared_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _report(script="train.py"), _report(script="other.py"))
    assert code == 0
    out, err = capsys.readouterr()
    assert err == ("python -m asyncthrottle compare: warning: BEFORE ran train.py and AFTER ran "
                   "other.py: the reports are of different scripts (compared all the same)\n")
    assert found["warnings"] == [err.split("warning: ", 1)[1].rstrip()]
    assert "(train.py -> other.py)" in out.splitlines()[0] and "  loss: equal" in out
    # the same script named another way: no warning
    _compare(tmp_path, _report(script="train.py"), _report(script="./train.py"))
    assert capsys.readouterr().err == ""


def test_the_json_out_and_one_that_cannot_be_written(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _report(), _report(steps_per_s=90.0), "--fail-if-slower",
                           "20")
    assert code == 0
    assert set(found) == {"compare", "unlike", "before", "after", "speed_ratio", "speed_noise",
                          "verdict_changed", "losses", "syncs", "rules", "warnings", "exit_code"}
    assert (found["compare"], found["exit_code"], found["rules"][0]["passed"]) == (1, 0, True)
    assert found["before"] == {"path": str(tmp_path / "before.json"), "script": "train.py",
                               "steps": 8, "steps_per_s": 100.0, "verdict": "synchronous"}
    capsys.readouterr()
    missing = tmp_path / "no_folder" / "out.json"
    assert main([*_files(tmp_path, _report(), _report()), "--json", str(missing)]) == UNUSABLE
    assert f"--json {str(missing)!r} could not be written" in capsys.readouterr().err


def test_compare_is_the_command_line_s_fourth_command(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["compare", *_files(tmp_path, _report(), _report())]) == 0
    assert capsys.readouterr().out.startswith("asyncthrottle compare: ")
    with pytest.raises(SystemExit):
        cli(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "{bench,plot,run,compare}" in said
    assert "compare: what changed between two run --json reports (compare --help)" in said


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_removing_a_loss_item_in_a_real_script_compares_as_one_read_removed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """item_every_step.py and item_removed.py (its .item() line removed), each run as train.py:
    the read is gone, the read after the loop moved up a line and is the same read, the losses
    equal."""
    started = []
    for name in ("item_every_step", "item_removed"):
        (tmp_path / name).mkdir()
        shutil.copy(SCRIPTS / f"{name}.py", tmp_path / name / "train.py")
        started.append(start("-m", "asyncthrottle", "run", "--json", str(tmp_path / f"{name}.json"),
                             "train.py", cwd=tmp_path / name))
    for process in started:
        done = process.wait()
        assert done.returncode == 0, done.stderr.decode()
    before, after = (str(tmp_path / f"{name}.json") for name in ("item_every_step", "item_removed"))
    assert read_report(Path(before))["steps"] == read_report(Path(after))["steps"] == 6
    out = tmp_path / "out.json"
    assert main([before, after, "--fail-on-new-syncs", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["losses"]["agree"] == "equal" and capsys.readouterr().err == ""
    assert [(c["change"], c["call"], c["before"]["site"], (c["after"] or {}).get("site"))
            for c in found["syncs"]["changes"]] == [("removed", "Tensor.item", "train.py:21", None)]
    # the mean's read, one line up: the same read (its function and text), not a change
    assert found["syncs"]["unchanged"] == 1 and found["syncs"]["moved"] == [
        {"call": "Tensor.__float__", "via": None, "in_step": False, "before": "train.py:22",
         "after": "train.py:21"}]
    # the other way round, the read is new in the steps
    assert main([after, before, "--fail-on-new-syncs"]) == FAILED
    assert "FAILED: train.py:21 Tensor.item reads in steps (6 in 6 steps" in capsys.readouterr().out


# -- the noise the step times show ----------------------------------------------------------------

def _timed(steps_per_s: float, swing: float = 0.05, steps: int = 40) -> dict[str, Any]:
    """A report whose step times drift by ``swing`` either way, every 4 steps, about a mean that
    makes ``steps_per_s``, after a warm-up step 50 times as long."""
    mean = 1 / steps_per_s
    step_s: list[float | None] = [mean * (1 + swing * ((k // 4) % 3 - 1)) for k in range(steps)]
    step_s[0] = 50 * mean
    report = _report(steps=steps, steps_per_s=steps_per_s)
    report["per_step"] = {"step_s": step_s, "input_wait_s": [0.0] * steps}
    return valid(report)


def test_the_noise_is_the_spread_of_blocks_of_steps_not_a_warm_up() -> None:
    from asyncthrottle.run.noise import relative_noise

    steady: list[float | None] = [0.01] * 40
    assert relative_noise(steady) == 0.0
    # a warm-up is no noise: it is in both runs
    assert relative_noise([0.5, *steady[1:]]) == 0.0
    # block means 0.0095, 0.01, 0.0105 in turn: their MAD 0.0005, over sqrt(10) blocks
    drift = _timed(100.0)["per_step"]["step_s"]
    assert relative_noise(drift) == pytest.approx(1.4826 * 0.0005 / 10 ** 0.5 / 0.01)
    # too few steps to tell; steps not timed are left out
    assert relative_noise([0.01] * 5) is None and relative_noise([None] * 40) is None
    assert relative_noise(None) is None


def test_a_speed_difference_within_the_noise_is_said_so_not_4_percent_slower(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, found = _compare(tmp_path, _timed(100.0), _timed(96.0), "--fail-if-slower", "10")
    said = capsys.readouterr().out
    noise = found["speed_noise"]
    # two standard errors of the ratio: each run's 2.34 %
    assert noise["pct"] == pytest.approx(2 * 2 ** 0.5 * 234.4 / 100, rel=1e-3) and noise["within"]
    assert noise["before_pct"] == pytest.approx(2.344, rel=1e-3)
    assert ("  speed: 100 -> 96.0 steps/s (x0.96: within the noise of \u00b16.6% the step times "
            "show, no faster nor slower that they can tell); steps 40 -> 40") in said
    assert "-4%" not in said and code == 0
    assert found["rules"][0]["why"] == ["AFTER 96.0 steps/s against BEFORE 100: 4.0% slower "
                                        "(within the noise of \u00b16.6% the step times show)"]


def test_a_difference_beyond_the_noise_is_said_with_it_and_none_without_step_times(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, found = _compare(tmp_path, _timed(100.0), _timed(80.0))
    assert found["speed_noise"]["within"] is False
    assert "(x0.80, -20%, beyond the noise of \u00b16.6% the step times show)" in \
        capsys.readouterr().out
    # a report without per-step times (a framework's steps): no noise to tell, as before
    _, found = _compare(tmp_path, _timed(100.0), _report(steps_per_s=96.0))
    assert found["speed_noise"] is None
    assert "(x0.96, -4%); steps" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_run_suggest_s_own_patch_passes_its_own_compare(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """#56: suggest_loop.py under ``run --suggest``, the patch applied with ``patch -p1``, the
    patched script under ``run --json``: the patch inserted lines above the loop and every read
    below them moved, yet compare says the rewritten read removed and each other read the same
    (``--fail-on-new-syncs`` passes). In subprocesses: ``run`` runs a script as ``__main__``
    and ``patch`` is the user's tool."""
    if shutil.which("patch") is None:
        pytest.skip("needs patch")
    name = "suggest_loop.py"
    ran, patched = tmp_path / "ran", tmp_path / "patched"
    for folder in (ran, patched):
        folder.mkdir()
        shutil.copy(SCRIPTS / name, folder / name)
    plain = start(name, cwd=ran)
    first = start("-m", "asyncthrottle", "run", "--suggest", str(tmp_path / "fix.patch"), "--json",
                  str(tmp_path / "before.json"), name, cwd=ran).wait()
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    assert plain.wait().stdout == first.stdout != b""
    before = read_report(tmp_path / "before.json")
    assert found_syncs(before) == said_syncs(name)
    assert sorted((entry["site"], entry["certain"]) for entry in before["patches"]) == [
        (f"{name}:20", False), (f"{name}:24", False), (f"{name}:30", False), (f"{name}:32", True),
        (f"{name}:34", False)]
    subprocess.run(["patch", "-p1", "-i", str(tmp_path / "fix.patch")], cwd=patched, check=True,
                   capture_output=True)
    second = start("-m", "asyncthrottle", "run", "--json", str(tmp_path / "after.json"), name,
                   cwd=patched).wait()
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    assert second.stdout == first.stdout  # the same lines, logged once each step completes
    after = read_report(tmp_path / "after.json")
    # every read is at another line now, and line 35 holds another read than before
    def sites(report: dict[str, Any]) -> set[tuple[str, str]]:
        return {(row["site"], row["text"]) for row in report["syncs"]}

    assert sites(before) & sites(after) == set()
    assert {site for site, _ in sites(before)} & {site for site, _ in sites(after)} == {
        f"{name}:35"}
    out = tmp_path / "out.json"
    code = main([str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                 "--fail-on-new-syncs", "--json", str(out)])
    said = capsys.readouterr().out
    assert code == 0, said
    found = json.loads(out.read_text())
    assert [(c["change"], c["before"]["site"]) for c in found["syncs"]["changes"]] == [
        ("removed", f"{name}:32")]
    assert found["syncs"]["unchanged"] == len(before["syncs"]) - 1 == 6
    assert "  sync sites (1 removed; 6 the same, 6 of them at another line):" in said
    assert "  --fail-on-new-syncs: passed" in said and found["losses"]["agree"] == "equal"
