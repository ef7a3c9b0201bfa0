"""max_memory=: the budget at each hand-out, its probes per backend, and its errors."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle import memory as mem
from asyncthrottle.backends import pinned
from asyncthrottle.testing import FakeDevice

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the loops of benchmarks/autodepth.py
from autodepth import drive, host_seconds

MiB = 2**20


class _PerStep:
    """A probe: 100 MiB per unfinished step (as a queued batch's pinned memory), and a part that checks hand-outs."""

    def __init__(self, thr: at.Throttle, budget: int) -> None:
        self.thr, self.budget = thr, budget
        self.handouts: list[tuple[int, int]] = []  # (in flight, bytes) at each hand-out
        thr.subscribe(self)

    def __call__(self) -> int:
        return 100 * MiB * self.thr.in_flight  # queries only

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self.handouts.append((in_flight, self()))


def _budgeted(depth: int | str | None, loop: str, steps: int = 200, **options: Any) -> tuple[at.Throttle, _PerStep]:
    dev = FakeDevice()
    box: list[_PerStep] = []
    thr = dev.throttle(depth, max_memory=at.MemoryBudget(250 * MiB, probe=lambda: box[0]()), **options)
    box.append(_PerStep(thr, 250 * MiB))
    drive(thr, loop, steps, host=dev.host, launch=dev.launch)
    return thr, box[0]


@pytest.mark.parametrize("depth", [8, None])
@pytest.mark.parametrize("loop", ["hiccup", "device-bound"])
def test_the_probe_never_exceeds_the_budget_at_a_hand_out(depth: int | None, loop: str) -> None:
    thr, probe = _budgeted(depth, loop)
    assert len(probe.handouts) == 200
    assert max(b for _, b in probe.handouts) <= 250 * MiB
    assert max(n for n, _ in probe.handouts) == 2  # 2 x 100 MiB fit, a third would not
    stats = thr.stats
    assert stats.memory_peak == 200 * MiB and stats.max_memory == 250 * MiB and stats.memory_waits > 0
    assert stats.memory_over == 0
    assert stats.max_in_flight == 3  # two at the hand-out, plus the step being recorded
    assert "memory: budget 250.0 MiB, peak at a hand-out 200.0 MiB" in thr.summary()


def test_without_the_budget_depth_8_holds_more() -> None:
    dev = FakeDevice()
    thr = dev.throttle(8)
    probe = _PerStep(thr, 0)
    drive(thr, "device-bound", 200, host=dev.host, launch=dev.launch)
    assert max(n for n, _ in probe.handouts) == 7


def test_auto_stops_at_the_depth_the_budget_allows() -> None:
    thr, probe = _budgeted("auto", "hiccup", steps=300)
    assert max(b for _, b in probe.handouts) <= 250 * MiB
    # 2 -> 3 fits (readings 0, 100 MiB at 0, 1 in flight: 200 MiB expected); 3 -> 4 would need 300 MiB.
    assert thr.depth == 3 and thr.stats.depth_changes == ((0, 2), (10, 3)) and thr.stats.memory_waits == 0


def test_auto_does_not_go_deeper_once_memory_has_held_the_host() -> None:
    dev = FakeDevice()

    def probe() -> int:  # 100 MiB per unfinished step, and a 2 GiB spike at the hand-out of every 10th step
        return 100 * MiB * thr.in_flight + (2048 * MiB if thr.stats.steps % 10 == 7 else 0)

    thr = dev.throttle("auto", max_memory=at.MemoryBudget(1000 * MiB, probe=probe))
    drive(thr, "hiccup", 300, host=dev.host, launch=dev.launch)
    # Strikes at steps 4 and 9 would raise the depth (as without the spikes), but the budget held the host
    # at step 7's hand-out since: memory, not depth, was the bound. And so on every 10 steps.
    assert thr.depth == 2 and thr.stats.memory_waits > 0 and thr.stats.dry_fraction > 0.1


def test_auto_goes_deeper_when_the_budget_has_room() -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto", max_memory=at.MemoryBudget(1000 * MiB, probe=lambda: 100 * MiB * thr.in_flight))
    drive(thr, "hiccup", 300, host=dev.host, launch=dev.launch)
    assert thr.depth == 4 and thr.stats.memory_waits == 0


def test_a_step_goes_when_nothing_is_in_flight_even_over_budget() -> None:
    dev = FakeDevice()
    # always over: no deadlock, depth 1 in effect
    thr = dev.throttle(4, max_memory=at.MemoryBudget(MiB, probe=lambda: 10 * MiB))
    drive(thr, "device-bound", 20, host=dev.host, launch=dev.launch)
    stats = thr.stats
    assert stats.steps == 20 and stats.memory_peak == 10 * MiB and stats.memory_over == 20
    assert "20 hand-outs over it with nothing in flight" in thr.summary()
    assert stats.in_flight_histogram[0] == 20  # every hand-out waited for everything


def test_break_exception_second_pass_and_timeout_under_a_budget() -> None:
    dev = FakeDevice()
    # wait="spin": each fake-clock read moves it on (a poll's last nap can round to nothing on a fake clock)
    budget = at.MemoryBudget(150 * MiB, probe=lambda: 100 * MiB * thr.in_flight)
    thr = dev.throttle(8, wait="spin", max_memory=budget, timeout=0.05)
    for step in thr.wrap(range(50)):
        dev.host(host_seconds("device-bound", step))
        dev.launch(0.010)
        if step == 10:
            break
    with pytest.raises(RuntimeError, match="boom"):
        for step in thr.wrap(range(50)):
            dev.launch(0.010)
            if step == 2:
                raise RuntimeError("boom")
    drive(thr, "device-bound", 20, host=dev.host, launch=dev.launch)  # a second full pass
    assert thr.stats.memory_peak == 100 * MiB
    it = iter(thr.wrap(range(5)))
    next(it)
    dev.launch(1.0)  # step 0 takes a second
    next(it)
    dev.launch(0.010)
    with pytest.raises(at.ThrottleTimeout):  # 2 in flight are over the budget: the wait for step 0 times out
        next(it)
    dev.host(1.0)
    assert next(it) == 2


def test_a_failing_probe_stops_the_hand_out_and_a_bad_reading_is_named() -> None:
    dev = FakeDevice()
    readings: list[Any] = [0, 0, None]
    thr = dev.throttle(8, max_memory=at.MemoryBudget(MiB, probe=lambda: readings.pop(0)))
    it = iter(thr.wrap(range(5)))
    next(it)
    dev.launch(0.010)
    next(it)
    dev.launch(0.010)
    with pytest.raises(TypeError, match=r"memory probe .* must return the bytes held as a number >= 0, got None"):
        next(it)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_memory": -1}, ValueError, r"max_memory must be a number of bytes > 0, a MemoryBudget or None, got -1"),
        ({"max_memory": 0}, ValueError, r"max_memory must be .* got 0"),
        ({"max_memory": math.nan}, ValueError, r"max_memory must be .* got nan"),
        ({"max_memory": math.inf}, ValueError, r"max_memory must be .* got inf"),
        ({"max_memory": "1GB"}, TypeError,
         r"max_memory must be a number of bytes > 0, a MemoryBudget or None, got '1GB'"),
        ({"max_memory": True}, TypeError, r"got True"),
        ({"max_memory": MiB, "memory": 5}, TypeError, r"memory must be a zero-argument callable .* got 5"),
        ({"memory": lambda: 0}, ValueError, r"memory=.* was given without max_memory=.*MemoryBudget"),
        ({"max_memory": at.MemoryBudget(MiB, probe=lambda: 0), "memory": lambda: 0}, ValueError,
         r"memory=.* and max_memory=MemoryBudget\(.*\) both give the budget's probe; drop memory="),
        ({"max_memory": MiB}, ValueError,
         r"max_memory needs a probe on this backend \(events\).*MemoryBudget\(<bytes>, probe="),
    ],
)
def test_bad_memory_options_name_the_argument_and_the_fix(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FakeDevice().throttle(2, **options)


def test_the_cpu_has_no_default_probe() -> None:
    with pytest.raises(ValueError, match=r"max_memory needs a probe on this backend \(cpu\).*rss_bytes"):
        at.Throttle(2, device="cpu", max_memory=MiB)
    # with a probe it works
    thr = at.Throttle(2, device="cpu", max_memory=at.MemoryBudget(10 * 2**40, probe=mem.rss_bytes))
    assert list(thr.wrap(range(3))) == [0, 1, 2]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: at.MemoryBudget(-1), ValueError, r"MemoryBudget bytes must be a number of bytes > 0, got -1"),
        (lambda: at.MemoryBudget(math.inf), ValueError, r"MemoryBudget bytes must be .* got inf"),
        (lambda: at.MemoryBudget("1GB"), TypeError, r"MemoryBudget bytes must be a number of bytes > 0, got '1GB'"),
        (lambda: at.MemoryBudget(None), TypeError, r"MemoryBudget bytes must be .* got None.*max_memory=None"),
        (lambda: at.MemoryBudget(MiB, probe=5), TypeError, r"MemoryBudget probe must be a zero-argument callable"),
    ],
)
def test_a_bad_memory_budget_is_refused_where_it_is_made(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_a_budget_is_a_value_and_bytes_alone_use_the_backends_probe() -> None:
    budget = at.MemoryBudget(MiB, probe=mem.rss_bytes)
    assert budget == at.MemoryBudget(MiB, probe=mem.rss_bytes) and budget != at.MemoryBudget(MiB)
    assert repr(budget) == f"MemoryBudget(bytes={MiB}, probe={mem.rss_bytes!r})"
    thr = at.Throttle(2, device="cpu", max_memory=at.MemoryBudget(10 * 2**40, probe=mem.rss_bytes))
    assert thr.stats.max_memory == 10 * 2**40
    with pytest.raises(ValueError, match=r"max_memory needs a probe on this backend \(cpu\)"):
        at.Throttle(2, device="cpu", max_memory=at.MemoryBudget(MiB))  # probe=None: the backend's, which has none


def test_memory_still_works_and_warns_at_the_users_line() -> None:
    readings = [100 * MiB]
    deprecated = r"memory= is deprecated .*max_memory=asyncthrottle\.MemoryBudget\("
    with pytest.warns(DeprecationWarning, match=deprecated) as caught:
        thr = FakeDevice().throttle(2, max_memory=MiB, memory=lambda: readings[0])
    assert caught[0].filename == __file__
    list(thr.wrap(range(3)))
    assert thr.stats.max_memory == MiB and thr.stats.memory_peak == 100 * MiB  # the probe given is the one read


def test_rss_bytes_is_this_process_resident_memory() -> None:
    rss = mem.rss_bytes()
    assert isinstance(rss, int) and 10 * MiB < rss < 2**40


def test_memory_waits_counts_only_real_waits_and_auto_still_goes_deeper() -> None:
    # The probe reads as the caching host allocator's stats do: blocks of a step already complete but not yet
    # retired still count (torch releases them later). Over the budget then, yet nothing is waited for: the oldest
    # step is retired at once. Those are no memory waits, and depth="auto" must not take them for memory pressure.
    dev = FakeDevice()

    def stale() -> int:
        pending = inside(thr).core.pending
        return 300 * MiB if pending and pending[0].query() else 0

    thr = dev.throttle("auto", max_memory=at.MemoryBudget(250 * MiB, probe=stale))
    drive(thr, "hiccup", 300, host=dev.host, launch=dev.launch)
    assert thr.stats.memory_waits == 0  # was one per such hand-out
    assert thr.depth == 4  # as with room in the budget; it stayed at 2


def test_memory_waits_counts_a_wait_the_budget_asked_for() -> None:
    dev = FakeDevice()
    thr = dev.throttle(8, max_memory=at.MemoryBudget(150 * MiB, probe=lambda: 100 * MiB * thr.in_flight))
    waits = []
    thr.subscribe(types.SimpleNamespace(on_wait=lambda step, start, seconds: waits.append(step)))
    drive(thr, "device-bound", 50, host=dev.host, launch=dev.launch)
    stats = thr.stats
    assert stats.memory_waits > 0 and stats.memory_waits <= len(waits)  # every counted wait happened


# host_memory_stats_as_nested_dict() as each torch version returns it, in a steady loop: two 64 MiB blocks in
# use, four in the pool (4 x 64 MiB), and the in-use byte count as that version keeps it.
_P = 64 * MiB
TORCH_2_7 = {  # allocation/allocated_bytes = in use, segment/reserved_bytes = the pool; in-use bytes drift up
    "allocation": {"current": 2, "peak": 4}, "allocated_bytes": {"current": 300 * _P, "peak": 300 * _P},
    "segment": {"current": 4, "peak": 4}, "reserved_bytes": {"current": 4 * _P, "peak": 4 * _P},
    "num_host_alloc": 4, "num_host_free": 0,
}
TORCH_2_11 = {  # renamed: active_* = in use, allocations/allocated_bytes = the pool; in-use bytes still drift
    "active_requests": {"current": 2, "peak": 4}, "active_bytes": {"current": 3 * _P, "peak": 5 * _P},
    "allocations": {"current": 4, "peak": 4}, "allocated_bytes": {"current": 4 * _P, "peak": 4 * _P},
    "num_host_alloc": 4, "num_host_free": 0,
}
TORCH_2_14 = {**TORCH_2_11, "active_bytes": {"current": 2 * _P, "peak": 4 * _P}}  # fixed: read as is


@pytest.mark.parametrize(
    ("stats", "trust", "expected"),
    [
        (TORCH_2_7, False, 2 * _P),  # 2 blocks x the pool's 64 MiB mean, not the drifted 300 blocks' worth
        (TORCH_2_11, False, 2 * _P),  # not active_bytes (3 blocks' worth and rising), not the pool (4)
        (TORCH_2_14, True, 2 * _P),
        (TORCH_2_7, True, 2 * _P),  # bytes above the pool are never believed, whatever the version says
        ({}, True, 0),  # CUDA not initialised, or nothing pinned yet
        ({}, False, 0),
        ({"active_bytes.current": 5, "allocated_bytes.current": 9}, True, 5),  # the flat form
        ({"allocation.current": 1, "segment.current": 2, "reserved_bytes.current": 8}, False, 4),
        ({"allocation.current": 1, "segment.current": 0, "reserved_bytes.current": 0}, False, 0),
    ],
)
def test_pinned_in_use_reads_every_torch_versions_stats(stats: dict[str, Any], trust: bool, expected: int) -> None:
    assert mem.pinned_in_use(stats, trust_bytes=trust) == expected


def test_pinned_in_use_falls_with_the_blocks_in_use_on_a_drifting_torch() -> None:
    # torch 2.11 after 120 steps of 16 MiB each (the H200 run): active_bytes rose by 16 MiB a step, the count fell.
    later = {**TORCH_2_11, "active_requests": {"current": 1}, "active_bytes": {"current": 120 * 16 * MiB}}
    assert mem.pinned_in_use(later, trust_bytes=False) == _P
    assert mem.pinned_in_use(later, trust_bytes=True) == _P  # bytes over the pool are not believed: estimated


def test_pinned_peak() -> None:
    assert mem.pinned_in_use({"active_bytes.current": 1, "active_bytes.peak": 8}, "peak") == 8
    assert mem.pinned_in_use(TORCH_2_14, "peak") == 4 * _P
    assert mem.pinned_in_use(TORCH_2_11, "peak", trust_bytes=False) == 4 * _P  # the pool's peak: an upper bound
    assert mem.pinned_in_use({}, "peak") == 0


@pytest.mark.parametrize(
    ("version", "trusted"),
    [("2.4.0", False), ("2.7.1+cu126", False), ("2.11.0+cu130", False), ("2.13.0", False), ("2.14.1+cu130", True),
     ("2.14.0a0+git1234", True), ("2.15.0.dev20270101", True), ("3.0", True)],
)
def test_bytes_are_trusted_from_torch_2_14(version: str, trusted: bool) -> None:
    assert pinned.bytes_trusted(version) is trusted


def test_cuda_probe_adds_pinned_host_memory_and_reserved_device_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "host_memory_stats_as_nested_dict", lambda: TORCH_2_11)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: calls.append(device) or 1000)
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    assert mem.cuda_probe("cuda:1")() == 3 * _P + 1000 and calls == ["cuda:1"]
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    monkeypatch.setattr(pinned, "_said", False)
    with caplog.at_level("WARNING", logger="asyncthrottle"):
        probe = mem.cuda_probe("cuda:1")
        mem.cuda_probe("cuda:1")
    assert probe() == 2 * _P + 1000  # estimated from the block counts
    assert [r.getMessage().count("cannot be trusted") for r in caplog.records] == [1]  # said once
    monkeypatch.delattr(torch.cuda, "host_memory_stats_as_nested_dict")
    monkeypatch.delattr(torch.cuda, "host_memory_stats")  # torch < 2.7: reserved memory only, and said
    caplog.clear()
    with caplog.at_level("WARNING", logger="asyncthrottle"):
        assert mem.cuda_probe(None)() == 1000
    assert "has no torch.cuda.host_memory_stats()" in caplog.text and "MemoryBudget(<bytes>, probe=...)" in caplog.text


def test_jax_probe_reads_memory_stats_and_refuses_a_backend_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jax")
    from asyncthrottle.backends import jax as atjax

    fake = types.SimpleNamespace(memory_stats=lambda: {"bytes_in_use": 123, "peak_bytes_in_use": 456})
    monkeypatch.setattr(atjax, "parse_jax_device", lambda jax, device: fake)
    assert mem.jax_probe("jax")() == 123
    none = types.SimpleNamespace(memory_stats=lambda: None)
    monkeypatch.setattr(atjax, "parse_jax_device", lambda jax, device: none)
    refused = r"reports no memory_stats\(\).*pass max_memory=MemoryBudget\(<bytes>, probe=...\).*rss_bytes"
    with pytest.raises(ValueError, match=refused):
        mem.jax_probe("jax")


@pytest.mark.jax
def test_jax_on_the_cpu_needs_a_probe_and_runs_with_one() -> None:
    jax = pytest.importorskip("jax")
    if jax.devices()[0].memory_stats():
        pytest.skip("this JAX backend reports memory_stats(): it has a default probe")
    with pytest.raises(ValueError, match=r"pass max_memory=MemoryBudget\(<bytes>, probe=...\)"):
        at.Throttle(2, device="jax", max_memory=MiB)
    # always over: one step at a time
    thr = at.Throttle(2, device="jax", max_memory=at.MemoryBudget(1, probe=mem.rss_bytes))
    x = jax.numpy.ones(4)
    for _ in thr.wrap(range(5)):
        x = x + 1
    assert thr.stats.steps == 5 and thr.stats.in_flight_histogram[0] == 5 and float(x[0]) == 6.0

