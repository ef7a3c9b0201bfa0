"""Straggler scores across real gloo process groups, and the stall report naming its rank."""

from __future__ import annotations

import json
import logging
import math
import socket
from pathlib import Path
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.ranks import RankScores, check_ranks_every, scores
from asyncthrottle.testing import FakeDevice

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

EVERY = 40  # ranks_every
STEP_S = 0.010  # a fast rank's device step (fake seconds)
SLOW = 1.5
STUCK_STEP = 4 * EVERY + 7  # where the straggler's device stops for a while (fake time)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _leave_together() -> None:
    """Every rank finishes before any tears its groups down: a rank that exits while another still
    talks to the store (rank 0 hosts it) or to a group aborts (gloo: "terminate called without an
    active exception", SIGABRT in about one run in three on a 2-core machine)."""
    dist.barrier()
    dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, slow: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    reports: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: reports.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("asyncthrottle").addHandler(handler)
    dev = FakeDevice()
    thr = dev.throttle(depth=2, wait="poll", ranks_every=EVERY, stall=5.0)
    named: dict[int, Any] = {}
    for step in thr.wrap(range(5 * EVERY)):
        dist.barrier()  # lockstep on the host, as a data-parallel loop is
        seconds = STEP_S * (SLOW if rank == slow else 1.0)
        dev.launch(60.0 if rank == slow and step == STUCK_STEP else seconds)
        stats = thr.stats
        named.setdefault(stats.slowest_rank, step)
    stats = thr.stats
    Path(out, f"{rank}.json").write_text(json.dumps({
        "named": {str(k): v for k, v in named.items()}, "scores": stats.rank_scores,
        "slowest": stats.slowest_rank, "stalls": stats.stalls, "reports": reports, "syncs": dev.syncs,
        "completed": stats.completed, "summary": thr.summary(),
    }))
    _leave_together()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_names_the_slow_one_within_two_intervals(world: int, tmp_path: Path) -> None:
    slow = world - 1
    mp.spawn(_worker, args=(world, _free_port(), slow, str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        seen = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        assert seen["named"][str(slow)] < 2 * EVERY, (rank, seen["named"])  # named within 2 intervals
        assert seen["slowest"] == slow
        assert seen["scores"][slow] == pytest.approx(1 / SLOW, rel=0.10)
        assert all(s == pytest.approx(1.0) for r, s in enumerate(seen["scores"]) if r != slow)
        assert f"slowest is rank {slow} (score 0.6" in seen["summary"]
        assert seen["syncs"] == 0 and seen["completed"] == 5 * EVERY  # no sync; unharmed by the stall
        if rank == slow:  # its device stopped: one report, naming the rank and the step
            (report,) = seen["reports"]
            assert f"rank {slow}: stalled: waited 5.0 s for step {STUCK_STEP} " in report
        else:
            assert seen["reports"] == [] and seen["stalls"] == 0


def test_scores_are_the_fastest_median_over_each_ranks() -> None:
    assert scores([2.0, 3.0]) == ((1.0, pytest.approx(2 / 3)), 1)
    result, slowest = scores([math.nan, 4.0, 2.0])
    assert math.isnan(result[0]) and result[1:] == (0.5, 1.0) and slowest == 1
    result, slowest = scores([math.nan, 0.0])
    assert slowest is None and all(math.isnan(s) for s in result)


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-3, ValueError), (1.5, TypeError),
                                              (True, TypeError), ("100", TypeError)])
def test_ranks_every_must_be_a_positive_int(value: object, error: type) -> None:
    with pytest.raises(error, match="ranks_every must be an int >= 1"):
        check_ranks_every(value)
    with pytest.raises(error, match="ranks_every"):
        FakeDevice().throttle(ranks_every=value)


def test_off_without_a_process_group_and_free_of_device_calls() -> None:
    assert not dist.is_initialized()
    counts = []
    for every in (None, 10):
        dev = FakeDevice()
        thr = dev.throttle(depth=2, wait="poll", ranks_every=every)
        for _ in thr.wrap(range(50)):
            dev.launch(STEP_S)
        counts.append((dev.records, dev.queries, dev.syncs, thr.stats.rank_scores))
    assert counts[0] == counts[1] == (50, counts[0][1], 0, None)


@pytest.mark.timeout(60)
def test_one_rank_in_process_reads_its_gather_without_waiting(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dev = FakeDevice()
        thr = dev.throttle(depth=2, wait="poll", ranks_every=10, sample_every=None)  # host step times
        ranks = inside(thr).part(RankScores)
        assert isinstance(ranks, RankScores)
        for _ in thr.wrap(range(30)):
            dev.launch(STEP_S)
            dev.host(0.002)
        deadline = 0
        while thr.stats.rank_scores is None and deadline < 1000:  # a gather in flight is read at a pause
            ranks.on_pause(0.0)
            deadline += 1
        assert thr.stats.rank_scores == (1.0,) and thr.stats.slowest_rank == 0
        assert ranks.median() == pytest.approx(STEP_S, rel=0.05) and dev.syncs == 0
        assert thr.stats.as_dict()["rank_score_0"] == 1.0
    finally:
        dist.destroy_process_group()


STOP_LIMIT_S = 30  # spawning (~5 s) + the group's timeout (4 s) + slack: beyond it the ranks hang


@pytest.mark.timeout(2 * STOP_LIMIT_S)
@pytest.mark.parametrize("mode", ["early", "never"])
def test_a_rank_that_stops_calling_the_throttle_hangs_no_other(mode: str, tmp_path: Path) -> None:
    """Rank 1's data ends after 5 steps (or it never runs a throttle): rank 0 logs once, goes on, scores unknown."""
    import os
    import signal
    import subprocess
    import sys

    worker = Path(__file__).with_name("_ranks_stop_worker.py")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(worker), str(tmp_path), str(_free_port()), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the spawned ranks too
        out, _ = proc.communicate()
        pytest.fail(f"hung: killed after {STOP_LIMIT_S} s; finished: {sorted(os.listdir(tmp_path))}\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    rank0 = json.loads(Path(tmp_path, "rank0.json").read_text())
    assert rank0["steps"] == 20
    assert rank0["rank_scores"] is None or "nan" in str(rank0["rank_scores"]).lower()  # unknown, not made up
    (log,) = rank0["logs"]  # once
    assert "rank 0 waited for rank 1 " in log and "timeout (0:00:04)" in log, log
    assert ("at step 9 (the gather of step 9)" if mode == "early" else "at step 0 (making") in log, log


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    """A DDP-like loop on the host clock: the all-reduce in backward makes every rank's step the slowest's."""
    from asyncthrottle.testing import FakeClock

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    factor = (2.0 if world == 2 else 3.0) if rank == world - 1 else 1.0
    seen = {}
    for sections in (False, True):
        clock = FakeClock()
        thr = at.Throttle(2, device="cpu", clock=clock, ranks_every=10)
        for _ in thr.wrap(range(40)):
            dist.barrier()  # lockstep, as DDP's all-reduce makes it
            if sections:
                with thr.section("forward"):
                    clock.advance(0.004 * factor)
                with thr.section("backward", collective=True):  # waits for the slowest rank's forward
                    clock.advance(0.004 * (3.0 - factor) + 0.008)
            else:
                clock.advance(0.004 * factor + 0.004 * (3.0 - factor) + 0.008)
        seen["sections" if sections else "steps"] = [thr.stats.rank_scores, thr.stats.slowest_rank]
    Path(out, f"{rank}.json").write_text(json.dumps(seen))
    _leave_together()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_sections_name_the_straggler_that_step_times_cannot(world: int, tmp_path: Path) -> None:
    mp.spawn(_ddp_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    slow = world - 1
    for rank in range(world):
        seen = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        step_scores, _ = seen["steps"]
        assert step_scores == pytest.approx([1.0] * world)  # equal step times: the culprit hides
        section_scores, slowest = seen["sections"]
        assert slowest == slow
        assert section_scores[slow] == pytest.approx(0.5 if world == 2 else 1 / 3)
        assert all(s == pytest.approx(1.0) for r, s in enumerate(section_scores) if r != slow)
