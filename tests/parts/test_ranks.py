"""Straggler scores across real gloo process groups, and the stall report naming its rank."""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import socket
import subprocess
import sys
import textwrap
import weakref
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.ranks import RankScores, check_ranks_every, check_ranks_timeout, scores
from asyncthrottle.testing import FakeDevice

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")


def _ranks(worker: Any, args: tuple[Any, ...], world: int) -> None:
    """``mp.spawn`` of ``world`` ranks, each forked from a forkserver that has imported torch and
    this module once (a pytest worker's, kept for its other tests), not a fresh interpreter that
    imports both (about 2.5 s of the 2-core machine's CPU a rank). Not forked from the pytest
    worker itself: its own threads (xdist's) must not be copied mid-call."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", __name__])
    mp.start_processes(worker, args=args, nprocs=world, join=True, start_method="forkserver")

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
    _ranks(_worker, (world, _free_port(), slow, str(tmp_path)), world)
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
        for work, _, _ in list(ranks._works):  # in flight: never waited for at the pass's end
            work.wait()  # the test waits (a one-rank gather: done at once) ...
        ranks.on_pause(0.0)  # ... and the part reads what is complete
        assert thr.stats.rank_scores == (1.0,) and thr.stats.slowest_rank == 0
        assert ranks.median() == pytest.approx(STEP_S, rel=0.05) and dev.syncs == 0
        assert thr.stats.as_dict()["rank_score_0"] == 1.0
    finally:
        dist.destroy_process_group()


STOP_LIMIT_S = 120  # spawning (~5-30 s on a busy machine) + ranks_timeout (4 s): far below gloo's 30 minutes


@pytest.mark.timeout(2 * STOP_LIMIT_S)
@pytest.mark.parametrize("mode", ["early", "late", "never"])
def test_a_rank_that_stops_calling_the_throttle_hangs_no_other(mode: str, tmp_path: Path) -> None:
    """Rank 1's data ends early (or it never runs a throttle): rank 0 never waits at a pass's end,
    logs once within ranks_timeout, though gloo's is 30 minutes, goes on, keeps the last scores."""
    import os
    import subprocess

    import forked

    worker = Path(__file__).with_name("_ranks_stop_worker.py")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # a fork of the suite's server that has imported torch, which forks its two ranks
    proc = forked.start([str(worker), str(tmp_path), str(_free_port()), mode], env=env)
    try:
        raw, err = proc.communicate(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # its process group: the ranks too
        raw, err = proc.communicate()
        pytest.fail(f"hung: killed after {STOP_LIMIT_S} s; finished: {sorted(os.listdir(tmp_path))}\n"
                    f"{(raw + err).decode()[-3000:]}")
    out = (raw + err).decode()
    assert proc.returncode == 0, out[-3000:]
    rank0 = json.loads(Path(tmp_path, "rank0.json").read_text())
    assert rank0["first"]["steps"] == 20
    if mode != "never":  # the pass's end waited for the gather rank 1 never joins (before: the timeout, logged)
        assert rank0["first"]["logs"] == []
    (log,) = rank0["logs"]  # once
    assert "rank 0: " in log and "timeout (0:00:04: ranks_timeout" in log, log
    assert rank0["stopped"] == [1], rank0
    if mode == "late":  # before: NaN scores, slowest None, "no step times yet"
        assert "the gather of step 14 had no answer from rank 1 (its last gather: step 9)" in log, log
        assert rank0["slowest"] == 1 and rank0["rank_scores"] == [1.0, pytest.approx(0.5)], rank0
        assert "slowest is rank 1 (score 0.50" in rank0["summary"], rank0["summary"]
    else:
        assert rank0["rank_scores"] is None and rank0["slowest"] is None  # unknown, not made up
        assert ("the gather of step 9 had no answer from rank 1 (no gather yet)" if mode == "early" else
                "making the gathers' gloo group at step 0 had no answer from rank 1 (it never ran") in log, log
    assert "ranks: the gathers stopped: rank 1 stopped calling the throttle" in rank0["summary"], rank0["summary"]


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
    _ranks(_ddp_worker, (world, _free_port(), str(tmp_path)), world)
    slow = world - 1
    for rank in range(world):
        seen = json.loads(Path(tmp_path, f"{rank}.json").read_text())
        step_scores, _ = seen["steps"]
        assert step_scores == pytest.approx([1.0] * world)  # equal step times: the culprit hides
        section_scores, slowest = seen["sections"]
        assert slowest == slow
        assert section_scores[slow] == pytest.approx(0.5 if world == 2 else 1 / 3)
        assert all(s == pytest.approx(1.0) for r, s in enumerate(section_scores) if r != slow)


class _Work:
    """A gather in flight on the fake group: complete once the other ranks answered (or failed)."""

    def __init__(self, dist: _FakeDist, rows: list[Any], mine: Any, step: int) -> None:
        self.dist, self.rows, self.mine, self.step = dist, rows, mine, step
        self.done = False
        self.error: Exception | None = None

    def answer(self) -> None:
        self.rows[0].copy_(self.mine)
        for rank, median in self.dist.others.items():
            self.rows[rank].fill_(median)
        self.done = True

    def fail(self) -> None:
        self.error, self.done = RuntimeError("gloo: timed out waiting for the gather"), True

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> bool:
        if not self.done:  # a real wait blocks here until every other rank has come
            self.dist.waited.append(self.step)
            self.answer()
        if self.error is not None:
            raise self.error
        return True


class _FakeDist:
    """torch.distributed as the ranks part sees it: this process is rank 0, the other ranks answer a
    gather when the test says so (``answer``), or never (``stop``: the store keeps their last step)."""

    def __init__(self, others: dict[int, float], *, timeout: timedelta = timedelta(minutes=30)) -> None:
        self.others = others
        self.works: list[_Work] = []
        self.waited: list[int] = []  # the gathers the part blocked on
        self.timeouts: list[timedelta] = []  # of the groups made
        self.store: dict[str, str] = {}
        self.stopped: dict[int, int] = {}  # rank: its last gather
        self.group = SimpleNamespace(WORLD=SimpleNamespace(_get_backend=self._no_backend))
        self.distributed_c10d = SimpleNamespace(_get_default_store=lambda: self,
                                                _get_default_timeout=lambda backend: timeout)

    @staticmethod
    def _no_backend(device: Any) -> Any:
        raise RuntimeError("no backend options here: the default timeout")

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_rank(self, group: Any = None) -> int:
        return 0

    def get_world_size(self, group: Any = None) -> int:
        return 1 + len(self.others)

    def new_group(self, *, backend: str, timeout: timedelta) -> str:
        self.timeouts.append(timeout)
        return "ranks"

    def all_gather(self, rows: list[Any], mine: Any, *, group: Any, async_op: bool) -> _Work:
        assert async_op and group == "ranks"
        work = _Work(self, rows, mine, int(self.store["asyncthrottle/ranks_every/step/0"]))
        self.works.append(work)
        return work

    # the default store
    def set(self, key: str, value: str) -> None:
        self.store[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(self._get(key) is not None for key in keys)

    def get(self, key: str) -> bytes:
        value = self._get(key)
        assert value is not None
        return value.encode()

    def _get(self, key: str) -> str | None:
        rank = int(key.rsplit("/", 1)[1])
        return str(self.stopped[rank]) if rank in self.stopped else (self.store.get(key) if rank == 0 else
                                                                       self.store["asyncthrottle/ranks_every/step/0"])

    def answer(self) -> None:
        for work in self.works:
            if not work.done:
                work.answer()


def _fake_world(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> _FakeDist:
    fake = _FakeDist({1: 2 * STEP_S}, **kwargs)  # rank 1's median: twice ours
    monkeypatch.setattr(RankScores, "_dist", lambda self: fake)
    return fake


@pytest.mark.parametrize("leave", ["pass end", "break", "drain()", "pause()", "pass end, no drain"])
def test_leaving_a_loop_never_waits_for_the_other_ranks(leave: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_world(monkeypatch)
    dev = FakeDevice()
    thr = dev.throttle(2, wait="poll", ranks_every=5, sample_every=None, drain=leave != "pass end, no drain")
    if leave.startswith("pass end") or leave == "break":
        for i in thr.wrap(range(10)):
            dev.host(STEP_S)
            if leave == "break" and i == 9:
                break
    else:
        for _ in range(10):
            with thr.step():
                dev.host(STEP_S)
        thr.drain() if leave == "drain()" else thr.pause()
    # before: the pass's end waited for both gathers, and so for every other rank (2.71 s measured)
    assert fake.waited == [] and [w.step for w in fake.works] == [4, 9]
    assert thr.stats.rank_scores is None
    fake.answer()  # the other rank comes
    for _ in thr.wrap(range(1)):  # the next pass reads them at its first record
        dev.host(STEP_S)
    assert fake.waited == []
    assert thr.stats.rank_scores == (1.0, pytest.approx(0.5)) and thr.stats.slowest_rank == 1


def test_a_rank_that_stops_leaves_the_last_scores_and_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    fake = _fake_world(monkeypatch)
    dev = FakeDevice()
    thr = dev.throttle(2, wait="poll", ranks_every=5, sample_every=None)
    for step in thr.wrap(range(20)):
        dev.host(STEP_S)
        if step <= 10:
            fake.answer()  # rank 1 answers the gathers of steps 4 and 9, then stops
        if step == 11:
            fake.stopped[1] = 9
        if step == 16:
            fake.works[2].fail()  # the gather of step 14: the group's timeout passed
    stats = thr.stats
    assert [w.step for w in fake.works] == [4, 9, 14]  # none launched once stopped
    # before: NaN scores and slowest_rank None, "no step times yet"
    assert stats.rank_scores == (1.0, pytest.approx(0.5)) and stats.slowest_rank == 1
    assert stats.stopped_ranks == (1,) and stats.as_dict()["ranks_stopped"] == 1
    summary = thr.summary()
    assert "slowest is rank 1 (score 0.50" in summary, summary
    assert "ranks: the gathers stopped: rank 1 stopped calling the throttle" in summary, summary
    (log,) = [r.getMessage() for r in caplog.records if "ranks_every" in r.getMessage()]
    assert "rank 1 (its last gather: step 9)" in log and "the gather of step 14" in log, log
    assert "scores stay those of the last gather read" in log, log


@pytest.mark.parametrize(("option", "pg", "group"), [
    (None, timedelta(minutes=30), timedelta(minutes=5)),  # the default bounds gloo's 30 minutes
    (2.5, timedelta(minutes=30), timedelta(seconds=2.5)),
    (600, timedelta(seconds=4), timedelta(seconds=4)),  # a shorter process group's timeout stays
])
def test_the_ranks_group_waits_at_most_ranks_timeout(option: float | None, pg: timedelta, group: timedelta,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_world(monkeypatch, timeout=pg)
    dev = FakeDevice()
    options = {} if option is None else {"ranks_timeout": option}
    thr = dev.throttle(2, wait="poll", ranks_every=5, **options)
    for _ in thr.wrap(range(2)):
        dev.host(STEP_S)
    assert fake.timeouts == [group]


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-1.0, ValueError), (math.nan, ValueError),
                                              (math.inf, ValueError), ("60", TypeError), (True, TypeError)])
def test_ranks_timeout_must_be_positive_seconds(value: object, error: type) -> None:
    with pytest.raises(error, match="ranks_timeout must be"):
        check_ranks_timeout(value)
    with pytest.raises(error, match="ranks_timeout"):
        FakeDevice().throttle(ranks_every=10, ranks_timeout=value)


@pytest.mark.parametrize("how", ["close()", "dropped", "dropped, its callback holding it"])
def test_a_closed_or_dropped_throttle_lets_go_of_its_group_and_gathers(how: str, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    """A gloo group or a gather's work destroyed while the interpreter is torn down aborts the process
    (SIGABRT, a torchrun rank's exit code -6, after destroy_process_group() too): the part lets go of them
    when its throttle is closed or dropped, never waiting for the other ranks -- a throttle its own
    callback holds too, once the collector frees it."""
    fake = _fake_world(monkeypatch)
    dev = FakeDevice()
    thr = dev.throttle(2, wait="poll", ranks_every=5, sample_every=None)
    for _ in thr.wrap(range(10)):
        dev.host(STEP_S)
    part = inside(thr).part(RankScores)
    assert len(part._works) == 2 and part._group == "ranks"  # in flight: the loop never waits for them
    works = part._works
    if how == "close()":
        thr.close()
    elif how == "dropped":
        del thr  # (freed at once: no garbage collection needed)
    else:
        thr.on_complete(functools.partial(_reads_stats, thr))
        ref = weakref.ref(part)
        del thr, part  # (the part holds a way to the throttle)
        gc.collect()
        assert ref() is None and not works and fake.waited == []
        return
    assert not works and part._group is False and fake.waited == []


def _reads_stats(thr: at.Throttle, step: int, values: dict[str, Any]) -> None:
    assert thr.stats.steps >= 0


def test_a_throttle_alive_at_exit_lets_go_before_the_interpreter_is_torn_down() -> None:
    """A throttle still held at exit (a script's global) is released by the exit handlers, while the
    interpreter is whole: its gathers' work is freed before the interpreter finalizes."""
    code = textwrap.dedent(f"""
        import atexit, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from collections import deque
        from helpers import inside
        from asyncthrottle.parts.ranks import RankScores
        from asyncthrottle.testing import FakeDevice

        class Work:
            def __del__(self):
                print("work freed, finalizing:", sys.is_finalizing())

        thr = FakeDevice().throttle(2, ranks_every=5)  # a global: alive at exit
        part = inside(thr).part(RankScores)
        part._works, part._group = deque([(Work(), [], 4)]), "group"
        del part
        atexit.register(lambda: print("exit handlers end"))  # (registered last: runs first)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["exit handlers end", "work freed, finalizing: False"], done.stdout
