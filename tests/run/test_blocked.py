"""The time each counted read blocked the script's thread: taken by a profile function installed at
the read's lookup only (never left installed: not after a read that raised, nor after a method
looked up and never called), by the runner's wrappers around torch's read functions; filed with
the read's count in steps and outside them; a script's own profile function and torch's profiler
are left alone (the read is then not timed). A fake clock that ticks at each reading makes each
timed read one tick (a lookup inside a waiting read reads it once more)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _runs import SharedRuns  # noqa: E402

from asyncthrottle.audit.patches import Patches  # noqa: E402
from asyncthrottle.audit.syncsites import SyncSites  # noqa: E402

HERE = Path(__file__).resolve().parent
NAME = Path(__file__).name
TICK = 1000  # ns


class Ticks:
    """A clock that moves ``TICK`` ns at each reading."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += TICK
        return self.now


@contextlib.contextmanager
def audit(clock: Callable[[], int] | None = None) -> Iterator[SyncSites]:
    sites = SyncSites([str(HERE)], **({"clock": clock} if clock is not None else {}))
    patches = Patches()
    try:
        sites.start(patches)
        yield sites
    finally:
        sites.stop()
        patches.undo()


@pytest.fixture
def sites() -> Iterator[SyncSites]:
    with audit(Ticks()) as counted:
        yield counted


def site(func: Callable[..., Any]) -> str:
    return f"{NAME}:{func.__code__.co_firstlineno}"


def blocked(sites: SyncSites, steps: int = 1) -> dict[tuple[str, str, bool], Any]:
    """Each row's (site, call, in_step): (count, blocked_s, blocked_per_step_s)."""
    return {(r["site"], r["call"], r["in_step"]): (r["count"], r["blocked_s"],
                                                   r["blocked_per_step_s"])
            for r in sites.rows(steps)}


X = torch.arange(6.0)
MASK = X > 2
SCALAR = X.sum()


def _loss_item() -> float:
    loss = SCALAR * 2
    return loss.item()


def _branch() -> int:
    if SCALAR:
        return 1
    return 0


READS: list[tuple[Callable[[], Any], str]] = [
    (_loss_item, "Tensor.item"),
    (_branch, "Tensor.__bool__"),
    (lambda: float(SCALAR), "Tensor.__float__"),
    (lambda: print(SCALAR, file=io.StringIO()), "Tensor.__str__"),
    (lambda: f"{SCALAR:.2f}", "Tensor.__format__"),
    (lambda: repr(X), "Tensor.__repr__"),
    (lambda: X[MASK], "Tensor.__getitem__"),
    (lambda: torch.nonzero(X), "torch.nonzero"),
    (lambda: torch.where(MASK), "torch.where"),
    (lambda: X.unique(), "Tensor.unique"),
    (lambda: 2.0 in X, "Tensor.__contains__"),
    (lambda: X.tolist(), "Tensor.tolist"),
    (lambda: list(map(float, [SCALAR, SCALAR])), "Tensor.__float__"),  # C calls one after another
]


@pytest.mark.parametrize(("read", "call"), READS, ids=[f"{c}@{i}" for i, (_, c) in enumerate(READS)])
def test_each_read_is_timed_and_leaves_no_profile_function(
        sites: SyncSites, read: Callable[[], Any], call: str) -> None:
    sites.in_step = True
    read()
    assert sys.getprofile() is None
    read()
    assert sys.getprofile() is None
    where = (_loss_item.__code__.co_firstlineno + 2 if read is _loss_item
             else _branch.__code__.co_firstlineno + 1 if read is _branch else None)
    name = f"{NAME}:{where}" if where is not None else site(read)
    count = 4 if "map" in read.__code__.co_names else 2
    # one tick each: from the call's start to its end, nothing else of the runner's
    assert blocked(sites, 2) == {(name, call, True): (count, count * TICK / 1e9,
                                                      count * TICK / 1e9 / 2)}


def test_real_reads_block_zero_seconds_or_more_with_the_real_clock() -> None:
    with audit() as real:
        for read, _ in READS:
            read()
    rows = real.rows(1)
    assert len(rows) == len(READS)  # a site each
    assert all(row["blocked_s"] is not None and row["blocked_s"] >= 0 for row in rows), rows
    assert sys.getprofile() is None


def test_a_read_that_raises_is_timed_and_removes_the_profile_function(sites: SyncSites) -> None:
    # (with grad: tensors that would live on the device, whose reads the audit counts)
    branch = lambda: bool(torch.ones(2, requires_grad=True))  # noqa: E731
    item = lambda: torch.ones(2, requires_grad=True).item()  # noqa: E731
    for read in (branch, item):
        with pytest.raises(RuntimeError):
            read()
        assert sys.getprofile() is None
    assert blocked(sites) == {(site(branch), "Tensor.__bool__", False): (1, TICK / 1e9, TICK / 1e9),
                              (site(item), "Tensor.item", False): (1, TICK / 1e9, TICK / 1e9)}


def test_a_method_looked_up_and_never_called_is_not_timed_and_not_left_installed(
        sites: SyncSites) -> None:
    def looked_up() -> bool:
        method = SCALAR.item  # counted as it is looked up
        return callable(method)

    def looked_up_then_busy() -> Any:
        method = SCALAR.item
        # the frame goes on without calling it: the profile function gives up, bounded
        total = sum(abs(k) for k in range(200))
        return sys.getprofile(), total, method

    assert looked_up() and sys.getprofile() is None
    installed, _, _ = looked_up_then_busy()
    assert installed is None
    assert [row["blocked_s"] for row in sites.rows(1)] == [None, None]
    # a method whose arguments make calls first is timed from its own call
    spaced = lambda: X.masked_select(torch.gt(X, abs(-2)))  # noqa: E731
    spaced()
    assert blocked(sites)[site(spaced), "Tensor.masked_select", False] == (1, TICK / 1e9,
                                                                           TICK / 1e9)


def test_a_script_s_own_profile_function_is_left_alone_and_its_reads_not_timed(
        sites: SyncSites) -> None:
    heard: list[str] = []

    def mine(frame: FrameType, event: str, arg: Any) -> None:
        heard.append(event)

    read = lambda: SCALAR.item()  # noqa: E731
    sys.setprofile(mine)
    try:
        read()
        float(SCALAR)
        assert sys.getprofile() is mine
    finally:
        sys.setprofile(None)
    assert "c_call" in heard and "c_return" in heard  # it heard the reads' calls
    assert [row["blocked_s"] for row in sites.rows(1)] == [None, None]
    read()  # once it is gone, reads are timed again
    assert blocked(sites)[site(read), "Tensor.item", False] == (2, TICK / 1e9, TICK / 1e9)


def test_under_torch_s_profiler_no_read_is_timed() -> None:
    read = lambda: SCALAR.item()  # noqa: E731
    with audit(Ticks()) as counted:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            read()
            assert sys.getprofile() is not counted.timer.profile
        read()
    assert blocked(counted)[site(read), "Tensor.item", False] == (2, TICK / 1e9, TICK / 1e9)


def test_a_profile_function_taken_away_mid_read_ends_that_timing(sites: SyncSites) -> None:
    def taken() -> Any:
        method = SCALAR.item
        sys.setprofile(None)  # the script's own, while the lookup waits for its call
        return method()

    taken()
    read = lambda: SCALAR.item()  # noqa: E731
    read()
    assert blocked(sites)[site(read), "Tensor.item", False] == (1, TICK / 1e9, TICK / 1e9)
    assert blocked(sites)[f"{NAME}:{taken.__code__.co_firstlineno + 1}", "Tensor.item",
                          False][1] is None


def test_what_runs_inside_a_read_is_its_time_and_what_runs_after_it_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Ticks()

    def work(ticks: int) -> None:  # time passes, the clock unread
        clock.now += ticks * TICK

    text = torch._tensor_str._str  # Tensor.__repr__'s own work, 5 ticks of it

    def slow(*args: Any, **kwargs: Any) -> str:
        work(5)
        return text(*args, **kwargs)

    monkeypatch.setattr(torch._tensor_str, "_str", slow)
    reads: list[tuple[Callable[[], Any], str, int]] = [
        (lambda: str(X), "Tensor.__str__", 6),  # str looks up __repr__, which does the work
        (lambda: repr(X), "Tensor.__repr__", 6),
        (lambda: X.__repr__(), "Tensor.__repr__", 6),
        (lambda: (float(SCALAR), work(7)), "Tensor.__float__", 1),
        (lambda: (SCALAR.item(), work(7)), "Tensor.item", 1),
        (lambda: (X[MASK], work(7)), "Tensor.__getitem__", 1),
    ]
    with audit(clock) as counted:
        for read, _, _ in reads:
            read()
    assert blocked(counted) == {(site(read), call, False): (1, ticks * TICK / 1e9,
                                                            ticks * TICK / 1e9)
                                for read, call, ticks in reads}


def test_a_step_without_a_counted_read_never_times_anything(
        sites: SyncSites, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops, the patched methods' calls that are no reads, and reads that are not counted (a
    tensor built from host data in a logger's function) install nothing and time nothing."""
    timed: list[str] = []
    monkeypatch.setattr(sites, "time_read", lambda *a: timed.append("lookup") or False)
    monkeypatch.setattr(sites, "timing", lambda: timed.append("wrapper") or False)

    def host_median() -> float:
        return torch.tensor([1.0, 3.0, 2.0]).median().item()

    sites.in_step = True
    for _ in range(3):
        (X + 1).relu().sum()
        X[0], X[1:3], X.to(torch.float64), X.to("cpu"), torch.where(MASK, X, 0.0)
        host_median()
        assert sys.getprofile() is None
    sites.in_step = False
    assert timed == [] and sites.rows(3) == []


def test_a_pause_never_resumed_is_dropped_at_the_next_read(
        sites: SyncSites, monkeypatch: pytest.MonkeyPatch) -> None:
    # __format__ looks item up inside: the timing pauses for that lookup, which (here) never
    # resumes it, so the read's return goes unheard
    monkeypatch.setattr(sites.timer, "resume", lambda: False)
    show = lambda: f"{SCALAR:.2f}"  # noqa: E731
    show()
    assert sys.getprofile() is None
    monkeypatch.undo()
    read = lambda: SCALAR.item()  # noqa: E731
    read()
    assert blocked(sites) == {(site(show), "Tensor.__format__", False): (1, None, None),
                              (site(read), "Tensor.item", False): (1, TICK / 1e9, TICK / 1e9)}


def test_a_read_inside_a_timed_read_is_part_of_it(sites: SyncSites) -> None:
    show = lambda: repr(SCALAR)  # noqa: E731  torch's repr calls item() inside
    show()
    assert blocked(sites) == {(site(show), "Tensor.__repr__", False): (1, TICK / 1e9,
                                                                      TICK / 1e9)}


def test_the_time_blocked_follows_the_count_in_and_out_of_steps(sites: SyncSites) -> None:
    read = lambda: SCALAR.item()  # noqa: E731
    for _ in range(3):
        sites.in_step = True
        read()
        read()
        sites.in_step = False
    read()
    sites.in_step = True
    sites.mark_tail()
    read()
    tail = sites.tail_rows()
    assert [(r["count"], r["blocked_s"]) for r in tail] == [(1, TICK / 1e9)]
    sites.discard_step()  # the open step was none: its read is outside steps
    sites.in_step = False
    assert blocked(sites, 3) == {
        (site(read), "Tensor.item", True): (6, 6 * TICK / 1e9, 2 * TICK / 1e9),
        (site(read), "Tensor.item", False): (2, 2 * TICK / 1e9, pytest.approx(2e-6 / 3))}
    assert sites.rows(0)[0]["blocked_per_step_s"] is None  # no steps: none a step


def test_a_read_whose_step_opened_while_it_ran_is_not_timed(sites: SyncSites) -> None:
    def across() -> Any:
        method = SCALAR.item  # counted outside steps...
        sites.in_step = True  # ...the step opens before it is called
        return method()

    across()
    assert blocked(sites) == {(f"{NAME}:{across.__code__.co_firstlineno + 1}", "Tensor.item",
                               False): (1, None, None)}


# -- end to end: a script under run -----------------------------------------------------------


def test_a_run_s_report_gives_each_read_its_time_blocked(shared_runs: SharedRuns) -> None:
    # the run test_html's real page reads
    done, report, _ = shared_runs.run("nan_steps.py", html=True)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = {(row["site"], row["in_step"]): row for row in report["syncs"]}
    assert set(rows) == {("nan_steps.py:29", True), ("nan_steps.py:33", False)}
    steps = report["steps"]
    for row in rows.values():
        assert row["blocked_s"] is not None and row["blocked_s"] >= 0
        assert row["blocked_per_step_s"] == pytest.approx(row["blocked_s"] / steps)
    said = done.stderr.decode()
    assert re.search(r"  count  per step +blocked\):\n    nan_steps\.py:29  Tensor\.item +80 +1\.00 +"
                     r"\d[\d.]* ms/step\n", said), said
    # a CPU run is synchronous: no suggestion promises what a fix recovers here; the report says
    # once, under the sync table, why it pays on an accelerator
    assert report["synchronous"] is True and "recovers" not in report["suggestions"][0]
    assert f"    1. {report['suggestions'][0]}" in said
    assert said.count("on an accelerator each read in the steps waits") == 1
