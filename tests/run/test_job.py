"""A torchrun job's one report, in-process: literal per-rank reports merged (ranks, straggler, sync
sites, collectives, the guard on every rank), their exchange through a store, the script's
collectives counted and judged only logged."""

from __future__ import annotations

import itertools
import json
import os
import signal
import types
from pathlib import Path
from typing import Any

import pytest
from _runs import valid

from asyncthrottle.audit.patches import Patches
from asyncthrottle.run import main
from asyncthrottle.run.collectives import Collectives
from asyncthrottle.run.compare import compare
from asyncthrottle.run.compare import text as compare_text
from asyncthrottle.run.html import render
from asyncthrottle.run.job import Job, gather
from asyncthrottle.run.jobmerge import merge, straggler
from asyncthrottle.run.jobreport import collective_advice, trouble
from asyncthrottle.run.logged import only_logged
from asyncthrottle.run.sigterm import Terminated
from asyncthrottle.run.text import text

torch = pytest.importorskip("torch")


def _report(steps: int = 20, step_ms: float = 50.0, forward: float = 5.0,
            backward: float = 40.0, optimizer: float = 1.0, input_ms: float = 1.0,
            syncs: list[dict[str, Any]] | None = None, code: int = 0,
            collectives: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One rank's report, as much of it as the merge reads; times in ms a step."""
    wall = steps * step_ms / 1000
    return {
        "schema": 1, "script": "train.py", "argv": ["train.py"], "exit_code": code,
        "steps": steps, "steps_per_s": steps / wall if wall else 0.0, "losses": [1.0] * steps, "nonfinite": [],
        "last_nonfinite": None, "syncs": syncs if syncs is not None else [],
        "verdict": "synchronous", "advice": "", "input_wait_s": input_ms * steps / 1000,
        "input_wait_fraction": input_ms / step_ms, "loader": None, "framework": None,
        "error": None, "stats": {"wall_s": wall}, "trace": None,
        "seen": dict.fromkeys(("forwards", "backwards", "optimizer_steps", "autograd_grad",
                               "other_threads", "processes"), steps),
        "sections": {"forward": forward, "backward": backward, "optimizer": optimizer},
        "per_step": {"step_s": [step_ms / 1000] * steps,
                     "input_wait_s": [input_ms / 1000] * steps}, "suggestions": [],
        "max_syncs_per_step": None, "over_limit": None, "guard": None, "options": [],
        "host": "node0", "collectives": collectives if collectives is not None else []}


def _row(site: str, count: int, steps: int = 20, *, in_step: bool = True,
         call: str = "Tensor.item") -> dict[str, Any]:
    return {"site": site, "call": call, "count": count, "per_step": count / steps,
            "in_step": in_step, "via": None, "file": f"/x/{site.partition(':')[0]}",
            "blocked_s": 0.001 * count, "blocked_per_step_s": 0.001 * count / steps}


# -- the straggler ----------------------------------------------------------------------------

def test_a_rank_slow_in_its_forward_is_named_with_what_the_others_wait() -> None:
    # DDP: rank 1's forward takes 30 ms more; rank 0 waits for it in its backward
    job = merge({0: _report(forward=5.0, backward=40.0), 1: _report(forward=35.0, backward=10.0)},
                {}, 2, None)
    assert job["straggler"] == {"rank": 1, "phase": "forward", "cost_fraction": 30.0 / 50.0}
    assert [row["sections"]["forward"] for row in job["ranks"]] == [5.0, 35.0]


def test_a_rank_slow_in_its_loader_is_named_by_its_input() -> None:
    reports = {rank: _report(input_ms=1.0) for rank in range(4)}
    reports[2] = _report(input_ms=21.0, backward=20.0)
    found = merge(reports, {}, 4, None)["straggler"]
    assert found == {"rank": 2, "phase": "input", "cost_fraction": pytest.approx(20.0 / 50.0)}


def test_even_ranks_have_no_straggler_within_the_threshold() -> None:
    # 4 ms apart in a 50 ms step: 8%, under the 10% that names one
    rows = merge({0: _report(forward=5.0), 1: _report(forward=9.0)}, {}, 2, None)["ranks"]
    assert straggler(rows) is None
    assert straggler(rows, even=0.05) == {"rank": 1, "phase": "forward",
                                          "cost_fraction": pytest.approx(0.08)}


def test_one_rank_with_steps_names_no_straggler() -> None:
    assert merge({0: _report(), 1: _report(steps=0)}, {}, 2, None)["straggler"] is None


# -- sites and collectives merged; the guard on every rank -----------------------------------

def test_sites_merge_with_each_ranks_count_and_a_site_of_some_ranks_is_marked() -> None:
    reports = {0: _report(syncs=[_row("train.py:9", 20), _row("train.py:12", 20)]),
               1: _report(syncs=[_row("train.py:9", 20)])}
    rows = {row["site"]: row for row in merge(reports, {}, 2, None)["syncs"]}
    assert rows["train.py:9"]["ranks"] == [20, 20] and rows["train.py:9"]["count"] == 40
    assert rows["train.py:9"]["blocked_s"] == pytest.approx(0.04)
    assert rows["train.py:12"]["ranks"] == [20, 0]
    said = text(merge(reports, {}, 2, None))
    assert "train.py:12  Tensor.item" in said and "(ranks 0 only)" in said
    assert said.count("(ranks 0 only)") == 1


def test_the_guard_fails_when_any_rank_is_over_the_limit() -> None:
    reports = {0: _report(syncs=[_row("train.py:9", 0 + 4)]),
               1: _report(syncs=[_row("train.py:9", 20)])}
    job = merge(reports, {}, 2, 0.5)
    assert job["guard"] == "over_limit" and job["over_limit"][0]["ranks"] == [4, 20]
    assert merge(reports, {}, 2, 1.0)["guard"] == "passed"
    assert merge(reports, {2: "gone"}, 3, 1.0)["guard"] == "not_counted"


def test_a_per_step_collective_only_logged_is_merged_and_suggested() -> None:
    each = [_row("train.py:30", 20, call="all_reduce") | {"only_logged": True}]
    job = merge({0: _report(collectives=each), 1: _report(collectives=each)}, {}, 2, None)
    (row,) = job["collectives"]
    assert row["ranks"] == [20, 20] and row["only_logged"] and row["per_step"] == 1.0
    (said,) = collective_advice(job["collectives"])
    assert said.startswith("train.py:30 all_reduce runs every step on every rank (40 calls")
    assert "reduce it once per log window" in said
    used = [_row("train.py:30", 20, call="all_reduce") | {"only_logged": False}]
    assert collective_advice(merge({0: _report(collectives=used)}, {}, 1, None)
                             ["collectives"]) == []


def test_the_job_text_names_ranks_straggler_and_the_missing() -> None:
    job = merge({0: _report(), 1: _report(forward=35.0, code=1)},
                {2: "it never started asyncthrottle run"}, 3, None)
    said = text(job)
    assert "asyncthrottle run (the job of 3 ranks; rank 0's figures first)" in said
    assert "    rank 1 on node0: 20 steps, 20 steps/s, step 50 ms; 35 / 40 / 1 / 1;" in said
    assert "exit code 1" in said
    assert "    rank 2: no report: it never started asyncthrottle run" in said
    assert "  straggler: rank 1, slow in its forward; the other ranks wait for it 60%" in said


# -- the exchange through the store ------------------------------------------------------------

def _clock() -> tuple[Any, Any]:
    now = itertools.count()
    ticks: list[float] = [0.0]

    def clock() -> float:
        return ticks[0]

    def sleep(seconds: float) -> None:
        ticks[0] += seconds
        next(now)
    return clock, sleep


def test_rank_0_gathers_every_report_and_names_the_ranks_that_never_came() -> None:
    store = torch.distributed.HashStore()
    ranks = [Job(rank, 4, store, run="r/0", host="node0", pid=100 + rank) for rank in range(4)]
    for rank in (0, 1, 2):
        ranks[rank].start()
    ranks[0].post({"steps": 3})
    ranks[1].post({"steps": 4})
    clock, sleep = _clock()
    reports, missing = gather(ranks[0], 2.0, clock=clock, sleep=sleep,
                              alive=lambda pid: {102: True}.get(pid, False))
    assert reports == {0: {"steps": 3}, 1: {"steps": 4}}
    assert clock() == pytest.approx(2.0)
    assert missing[2] == ("it started on node0 (pid 102) and was still running 2 s after rank 0 "
                          "ended (a hang, or a longer script: raise --ranks-timeout)")
    assert missing[3].startswith("it never started asyncthrottle run")
    # another machine's rank: its process cannot be asked
    Job(3, 4, store, run="r/0", host="node1", pid=7).start()
    assert gather(ranks[0], 0.0, clock=clock, sleep=sleep)[1][3] == (
        "it started on node1 (pid 7) and sent no report within 0 s (--ranks-timeout)")


def test_another_attempts_reports_are_never_read() -> None:
    store = torch.distributed.HashStore()
    Job(1, 2, store, run="r/0").post({"steps": 1})
    clock, sleep = _clock()
    reports, missing = gather(Job(0, 2, store, run="r/1"), 0.1, clock=clock, sleep=sleep)
    assert reports == {} and sorted(missing) == [0, 1]


def test_rank_0_stops_waiting_soon_after_torchruns_sigterm() -> None:
    store = torch.distributed.HashStore()
    clock, sleep = _clock()
    terminated = Terminated(clock)
    terminated.reporting = True
    terminated.handle(signal.SIGTERM, None)
    assert not terminated.over()
    _, missing = gather(Job(0, 2, store, run="r/0"), 60.0, clock=clock, sleep=sleep,
                        stop=terminated.over)
    assert clock() == pytest.approx(5.0, abs=0.1) and sorted(missing) == [0, 1]


def test_torchruns_sigterm_ends_the_script_by_system_exit_and_the_report_by_sigterm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    terminated = Terminated()
    with pytest.raises(SystemExit) as ended:
        terminated.handle(signal.SIGTERM, None)
    assert ended.value.code == 128 + signal.SIGTERM
    terminated.reporting = True
    assert terminated.handle(signal.SIGTERM, None) is None
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        terminated.install()
        assert signal.getsignal(signal.SIGTERM) == terminated.handle
        terminated.close()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sent == [(os.getpid(), signal.SIGTERM)]


def test_a_rank_says_only_what_went_wrong_on_it() -> None:
    one = Job(1, 2, torch.distributed.HashStore(), host="node1")
    assert trouble(_report(), 0, one) == []
    raised = _report(code=1) | {"raised": {"type": "RuntimeError", "site": "train.py:40"}}
    assert trouble(raised, 1, one) == [
        "asyncthrottle run (rank 1 of 2 on node1): the script raised RuntimeError at "
        "train.py:40; the job's report is rank 0's"]


# -- the script's collectives --------------------------------------------------------------------

def test_the_scripts_collectives_are_counted_at_its_line_timed_and_in_or_out_of_steps(
        tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []
    dist = types.SimpleNamespace(all_reduce=lambda *a, **k: calls.append(a),
                                 barrier=lambda *a, **k: calls.append(a))
    stepping = [True]
    ticks = itertools.count()
    found = Collectives([str(tmp_path)], lambda: stepping[0], clock=lambda: float(next(ticks)))
    patches = Patches()
    found.install(dist, patches)
    script = tmp_path / "train.py"
    code = compile("for _ in range(3):\n    dist.all_reduce(t)\ndist.barrier()\n",
                   str(script), "exec")
    script.write_text("")
    exec(code, {"dist": dist, "t": 1})
    stepping[0] = False
    exec(compile("dist.barrier()\n", str(script), "exec"), {"dist": dist})
    patches.undo()
    exec(code, {"dist": dist, "t": 1})
    rows = {(row["site"], row["in_step"]): row for row in found.rows(3)}
    assert len(calls) == 3 + 1 + 1 + 4
    assert rows["train.py:2", True]["count"] == 3 and rows["train.py:2", True]["blocked_s"] == 3.0
    assert rows["train.py:2", True]["per_step"] == 1.0
    assert rows["train.py:3", True]["count"] == 1 and rows["train.py:1", False]["count"] == 1
    assert not any(row["only_logged"] for row in rows.values())


@pytest.mark.parametrize(("body", "logged"), [
    ("    dist.all_reduce(m)\n    print(f'{m.item():.3f}')\n", True),
    ("    dist.all_reduce(m)\n    avg = m.item() / 2\n    logger.info('loss %f', avg)\n", True),
    ("    dist.all_reduce(m)\n    if rank == 0:\n        writer.add_scalar('l', m, 1)\n", True),
    ("    dist.all_reduce(m)\n    p.grad = m\n", False),
    ("    dist.all_reduce(m)\n    print(m.item())\n    total = total + m\n", False),
    ("    dist.all_reduce(m)\n", False),
])
def test_a_collectives_result_only_logged(tmp_path: Path, body: str, logged: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text("for step in range(9):\n    m = loss.detach().clone()\n" + body)
    assert only_logged(str(script), 3, "all_reduce") is logged


def test_a_collective_outside_a_loop_is_not_judged(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("dist.all_reduce(m)\nprint(m)\n")
    assert not only_logged(str(script), 1, "all_reduce")


# -- the page, compare and the schema -----------------------------------------------------------

def _job() -> dict[str, Any]:
    each = [_row("train.py:30", 20, call="all_reduce") | {"only_logged": True}]
    reports = {0: _report(collectives=each, syncs=[_row("train.py:9", 20)]),
               1: _report(forward=35.0, backward=10.0, collectives=each, syncs=[])}
    return merge(reports, {2: "it never started asyncthrottle run"}, 3, None)


def test_the_page_shows_each_ranks_strip_the_straggler_and_the_collectives() -> None:
    page = render(_job())
    assert "<strong>Straggler: rank 1</strong>, slow in its <strong>forward</strong>" in page
    assert page.count('title="forward ') == 2 and 'title="forward 35 ms"' in page
    assert '<tr class="slowest"><td>1 (straggler)</td>' in page
    assert "<li>rank 2: it never started asyncthrottle run</li>" in page
    assert "<code>all_reduce</code>" in page and "in steps, only logged" in page
    assert "(ranks 0 only)" in page


def test_compare_of_two_job_reports_names_the_straggler_and_the_collectives() -> None:
    before = _job()
    after = merge({0: _report(), 1: _report()}, {}, 2, None)
    found = compare(before, after)
    assert found["straggler"] == [before["straggler"], None]
    assert found["world_size"] == [3, 2]
    assert [c["change"] for c in found["collectives"]["changes"]] == ["removed"]
    said = compare_text(found, before, after)
    assert "  straggler: rank 1 (forward, 60%) -> none" in said
    assert "  collectives (1 removed; 0 the same):" in said
    assert "straggler" not in compare(_report(), _report())


def test_a_job_report_is_described_by_the_schema() -> None:
    assert valid(json.loads(json.dumps(_job())))


# -- the option ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_a_bad_ranks_timeout_is_a_usage_error_naming_the_option(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--ranks-timeout", value, "train.py"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert f"--ranks-timeout must be a finite number of seconds > 0, got {value!r}, e.g. 60" in err


def test_ranks_timeout_is_taken_and_its_value_is_not_the_script() -> None:
    from asyncthrottle.run import _split

    assert _split(["--ranks-timeout", "5", "train.py", "--lr", "1"]) == (
        ["--ranks-timeout", "5"], "train.py", ["--lr", "1"])


def test_a_collective_a_package_made_names_its_line() -> None:
    each = [_row("train.py:40", 3, call="barrier", in_step=False)
            | {"only_logged": False, "via": "lightning/strategy.py:77"}]
    job = merge({0: _report(collectives=each), 1: _report(collectives=each)}, {}, 2, None)
    assert "    train.py:40  barrier (in lightning/strategy.py:77)  6  0.15" in text(job)
    assert '<span class="via">in lightning/strategy.py:77</span>' in render(job)
