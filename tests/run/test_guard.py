"""``run --max-syncs-per-step N``: the rule on report data, its lines, the exit code, the option;
then the whole story once: a script that reads ``loss.item()`` every step fails under
``--max-syncs-per-step 0``, the same script with the read removed passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _runs import read_report, start

from asyncthrottle.run import _parser, _split, main
from asyncthrottle.run.guard import GUARD_EXIT, exit_code, judge
from asyncthrottle.run.text import text


def row(site: str, per_step: float, *, in_step: bool = True, steps: int = 10,
        call: str = "Tensor.item", via: str | None = None) -> dict[str, Any]:
    return {"site": site, "call": call, "count": round(per_step * steps), "per_step": per_step,
            "in_step": in_step, "via": via, "file": f"/abs/{site.partition(':')[0]}"}


def report(syncs: list[dict[str, Any]] | None, steps: int = 10, code: int = 0) -> dict[str, Any]:
    """The report data text() reads, with ``syncs`` and ``steps``."""
    return {"script": "train.py", "argv": ["train.py"], "exit_code": code, "steps": steps,
            "steps_per_s": 10.0, "stats": {"wall_s": 1.0}, "seen": {}, "error": None,
            "verdict": "synchronous", "advice": "", "losses": [1.0] * steps, "nonfinite": [],
            "last_nonfinite": None, "sections": {}, "input_wait_s": 0.0,
            "input_wait_fraction": 0.0, "syncs": syncs, "suggestions": [], "trace": None}


SYNCS = [row("train.py:20", 2.0), row("train.py:30", 0.5),
         row("train.py:40", 1.0, call="Tensor.__bool__", via="transformers/trainer.py:1919"),
         row("train.py:50", 3.0, in_step=False)]


def guarded(data: dict[str, Any], limit: float | None) -> dict[str, Any]:
    data.update(judge(data, limit))
    return data


def test_a_site_read_in_steps_more_often_than_the_limit_fails_and_reads_outside_steps_do_not() -> None:
    judged = judge(report(SYNCS), 0.5)
    assert judged["guard"] == "over_limit" and judged["max_syncs_per_step"] == 0.5
    # 0.5 a step is not over 0.5; train.py:50 reads 3 a step outside the steps
    assert [r["site"] for r in judged["over_limit"]] == ["train.py:20", "train.py:40"]
    assert judged["over_limit"][1] == SYNCS[2]  # the report's own rows
    assert judge(report(SYNCS), 2.0) == {"max_syncs_per_step": 2.0, "over_limit": [],
                                         "guard": "passed"}
    assert [r["site"] for r in judge(report(SYNCS), 0)["over_limit"]] == [
        "train.py:20", "train.py:40", "train.py:30"]  # the most first


def test_without_the_option_the_fields_are_null_and_nothing_fails() -> None:
    data = guarded(report(SYNCS), None)
    assert (data["max_syncs_per_step"], data["over_limit"], data["guard"]) == (None, None, None)
    assert exit_code(0, data) == 0
    assert "--max-syncs-per-step" not in text(data)


def test_no_step_found_cannot_be_judged_and_fails() -> None:
    for syncs in ([], [row("train.py:9", 0.0, in_step=False, steps=0)]):
        data = guarded(report(syncs, steps=0), 0)
        assert (data["guard"], data["over_limit"]) == ("no_steps", [])
        assert exit_code(0, data) == GUARD_EXIT
        assert text(data).splitlines()[-1] == (
            "  --max-syncs-per-step 0: FAILED: no training step found, so its syncs per step "
            f"cannot be judged (exit code {GUARD_EXIT})")
    assert judge(report(None), 1)["guard"] == "not_counted"


def test_the_script_s_own_failure_keeps_its_exit_code() -> None:
    for code in (1, 2, 120, -9):
        data = guarded(report(SYNCS, code=code), 0)
        assert exit_code(code, data) == code
        assert f"the script's own exit code {code} stands" in text(data)
    assert exit_code(0, guarded(report(SYNCS), 0)) == GUARD_EXIT
    assert exit_code(0, guarded(report(SYNCS), 5)) == 0


def test_the_text_names_each_site_over_the_limit_how_often_and_the_limit_last() -> None:
    lines = text(guarded(report(SYNCS), 0.5)).splitlines()
    assert lines[-3:] == [
        f"  --max-syncs-per-step 0.5: FAILED: 2 sync sites over the limit (exit code {GUARD_EXIT})",
        "    train.py:20 reads Tensor.item 2.00 times a step in steps, over the limit of 0.5",
        "    train.py:40 reads Tensor.__bool__ (in transformers/trainer.py:1919) 1.00 times a "
        "step in steps, over the limit of 0.5"]
    passed = text(guarded(report(SYNCS), 2)).splitlines()[-1]
    assert passed == ("  --max-syncs-per-step 2: passed: no sync site in the steps reads device "
                      "values more than 2 times a step")


def test_the_option_takes_a_number_at_least_0_before_the_script() -> None:
    own, script, rest = _split(["--max-syncs-per-step", "0.5", "train.py", "--max-syncs-per-step",
                                "1"])
    assert (script, rest) == ("train.py", ["--max-syncs-per-step", "1"])  # the script's own
    assert _parser().parse_args(own).max_syncs_per_step == 0.5
    assert _parser().parse_args(["--max-syncs-per-step=0"]).max_syncs_per_step == 0.0
    assert _parser().parse_args([]).max_syncs_per_step is None
    assert f"{GUARD_EXIT}: --max-syncs-per-step failed" in _parser().format_help()


@pytest.mark.parametrize("value", ["-1", "-0.5", "abc", "nan", "inf", ""])
def test_a_bad_limit_is_a_usage_error_naming_the_option_and_the_fix(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--max-syncs-per-step", value, "train.py"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"--max-syncs-per-step must be a finite number >= 0, got {value!r}" in err
    assert "e.g. 0 (none) or 0.5" in err


def test_a_loss_item_every_step_fails_at_0_and_passes_once_removed(tmp_path: Path) -> None:
    runs = {name: start("-m", "asyncthrottle", "run", "--max-syncs-per-step", "0", "--json",
                        str(tmp_path / f"{name}.json"), f"{name}.py")
            for name in ("item_every_step", "item_removed")}
    every, removed = (runs[name].wait() for name in runs)
    assert every.returncode == GUARD_EXIT, every.stderr.decode()[-3000:]
    assert removed.returncode == 0, removed.stderr.decode()[-3000:]
    # the same training: the removed read changed nothing of it
    assert every.stdout.splitlines()[-1] == removed.stdout.splitlines()[-1]
    failed, passed = (read_report(tmp_path / f"{name}.json") for name in runs)
    assert failed["exit_code"] == 0 and failed["guard"] == "over_limit"
    assert [(r["site"], r["call"], r["per_step"]) for r in failed["over_limit"]] == [
        ("item_every_step.py:21", "Tensor.item", 1.0)]
    assert "    item_every_step.py:21 reads Tensor.item 1.00 times a step in steps, over the " \
           "limit of 0" in every.stderr.decode()
    # the mean's read after the loop is outside the steps
    assert (passed["guard"], passed["over_limit"], passed["max_syncs_per_step"]) == (
        "passed", [], 0.0)
    assert any(not r["in_step"] for r in passed["syncs"])


def test_a_script_that_ends_by_os_exit_is_judged_before_it_dies(tmp_path: Path) -> None:
    """hard_exit.py ends by ``os._exit``: no atexit handler runs, so the report is made inside
    the call, and the guard's exit code is the one the process dies with; a code of the script's
    own stands. In subprocesses: ``os._exit`` ends the process that calls it (pytest's, in
    process), and what is tested is what a dying process leaves: its exit code, its stdout, its
    stderr, and a forked DataLoader worker's own ``os._exit``."""
    plain = start("hard_exit.py")
    guarded = start("-m", "asyncthrottle", "run", "--max-syncs-per-step", "0", "--json",
                    str(tmp_path / "report.json"), "hard_exit.py")
    kept = start("-m", "asyncthrottle", "run", "--max-syncs-per-step", "0", "hard_exit.py", "7")
    plain_done, guarded_done, kept_done = plain.wait(), guarded.wait(), kept.wait()
    err = guarded_done.stderr.decode()
    assert plain_done.returncode == 0 and guarded_done.returncode == GUARD_EXIT, err[-3000:]
    # the script's own lines, and neither its finally nor its atexit handler ran
    assert guarded_done.stdout == plain_done.stdout and len(plain_done.stdout.splitlines()) == 4
    for done in (plain_done, guarded_done, kept_done):
        assert b"finally ran" not in done.stderr and b"atexit ran" not in done.stderr
    report = read_report(tmp_path / "report.json")
    assert (report["exit_code"], report["steps"], report["guard"]) == (0, 4, "over_limit")
    assert [(r["site"], r["per_step"]) for r in report["over_limit"]] == [("hard_exit.py:27", 1.0)]
    assert err.rstrip().endswith("    hard_exit.py:27 reads Tensor.item 1.00 times a step in "
                                 "steps, over the limit of 0")
    # os._exit(7): the script's code stands, and the guard still says it failed
    assert kept_done.returncode == 7, kept_done.stderr.decode()[-3000:]
    assert "FAILED: 1 sync site over the limit (the script's own exit code 7 stands)" in \
        kept_done.stderr.decode()
