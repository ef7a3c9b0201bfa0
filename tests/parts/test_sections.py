"""Sections: pairs of pooled timing events read at retirement (never a sync), the host clock when synchronous."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.sections import Sections
from asyncthrottle.testing import FakeClock, FakeDevice


def test_sections_record_a_pair_per_sampled_step_and_read_them_at_retire_without_a_sync() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=2)
    part = inside(thr).part(Sections)
    assert isinstance(part, Sections)
    records = []
    for step in thr.wrap(range(8)):
        before = dev.records
        with thr.section("forward"):
            dev.launch(0.010)
        with thr.section("backward"):
            dev.launch(0.020)
        records.append(dev.records - before)
        if step == 3:  # step 2's pair was recorded, and is read only once step 2 retires
            assert len(part.waiting) == 1 and thr.stats.sections is None
    # a pair per section on sampled steps, none on the others nor on step 0 (its one-time work)
    assert records == [0, 0] + [4, 0] * 3
    assert thr.stats.sections == {"forward": pytest.approx(10.0), "backward": pytest.approx(20.0)}
    assert not part.waiting
    assert dev.syncs == 0


def test_sections_never_sync_while_the_loop_runs() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1, drain=False)
    for _ in thr.wrap(range(20)):
        with thr.section("forward"):
            dev.launch(0.010)
    assert dev.syncs == 0 and thr.stats.sections is not None


def test_a_name_used_twice_in_a_step_counts_the_sum() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1)
    for _ in thr.wrap(range(4)):
        for _micro in range(3):
            with thr.section("forward"):
                dev.launch(0.001)
    assert thr.stats.sections == {"forward": pytest.approx(3.0)}


def test_a_synchronous_backend_uses_the_host_clock() -> None:
    clock = FakeClock()
    thr = at.Throttle(2, device="cpu", clock=clock)
    for _ in thr.wrap(range(5)):
        with thr.section("forward"):
            clock.advance(0.004)
        clock.advance(0.001)
    assert thr.stats.sections == {"forward": pytest.approx(4.0)}
    assert "section forward: 4.00 ms/step (median)" in thr.summary()
    assert thr.stats.as_dict()["section_ms_forward"] == pytest.approx(4.0)


def test_begin_step_loops_and_the_view_have_sections() -> None:
    clock = FakeClock()
    thr = at.Throttle(2, device="cpu", clock=clock)
    for _ in range(3):
        thr.begin_step()
        with thr.section("optimizer"):
            clock.advance(0.002)
        thr.end_step()
    view = at.throttle(range(3), device="cpu", clock=clock)
    for _ in view:
        with view.section("step"):
            clock.advance(0.003)
    assert thr.stats.sections == {"optimizer": pytest.approx(2.0)}
    assert view.stats.sections == {"step": pytest.approx(3.0)}


def test_a_section_outside_a_step_is_an_error() -> None:
    thr = at.Throttle(2, device="cpu")
    with pytest.raises(RuntimeError, match=r"section\('forward'\) was entered outside a step"):
        with thr.section("forward"):
            pass
    for _ in thr.wrap(range(2)):
        pass
    with pytest.raises(RuntimeError, match="outside a step"):  # after the loop
        thr.section("forward").__enter__()
    thr.begin_step()
    thr.end_step()
    with pytest.raises(RuntimeError, match="outside a step"):  # between end_step() and begin_step()
        thr.section("forward").__enter__()


def test_a_section_nested_in_itself_is_an_error_and_other_names_nest() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1)
    for _ in thr.wrap(range(1)):
        with thr.section("backward"), thr.section("allreduce", collective=True):
            dev.launch(0.001)
        with thr.section("forward"):
            with pytest.raises(RuntimeError, match=r"section\('forward'\) was entered while already open in step 0"):
                with thr.section("forward"):
                    pass


def test_a_section_left_open_raises_at_the_record_and_the_next_step_is_clean() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1)
    thr.begin_step()
    thr.section("forward").__enter__()
    with pytest.raises(RuntimeError, match=r"section\(s\) 'forward' still open when step 0 was recorded"):
        thr.end_step()
    assert thr.stats.steps == 1  # the step counts
    with thr.step():
        with thr.section("forward"):
            dev.launch(0.002)
    thr.drain()
    assert thr.stats.sections == {"forward": pytest.approx(2.0)}


def test_a_failed_step_drops_its_sections() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1)
    with pytest.raises(ValueError), thr.step():
        with thr.section("forward"):
            dev.launch(0.002)
        raise ValueError
    thr.drain()
    assert thr.stats.sections is None


def test_a_loop_without_sections_subscribes_nothing() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1)
    part = inside(thr).part(Sections)
    for _ in thr.wrap(range(3)):
        dev.launch(0.001)
    assert part is not None and not part.listening and thr.stats.sections is None
    core = inside(thr).core
    assert core.lean and not any("Sections" in repr(hook) for hook in core.on_record + core.on_drop)


def test_without_device_timing_an_asynchronous_device_times_no_sections() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    for _ in thr.wrap(range(3)):
        with thr.section("forward"):
            dev.launch(0.001)
    assert thr.stats.sections is None and dev.syncs == 0


def test_bad_names_are_refused() -> None:
    thr = at.Throttle(2, device="cpu")
    with pytest.raises(ValueError, match="section name must be a non-empty str"):
        thr.section("")  # a wrong value
    with pytest.raises(TypeError, match="section name must be a non-empty str"):
        thr.section(5)  # a wrong type


def test_the_trace_shows_sections_as_device_spans() -> None:
    from asyncthrottle.parts.trace import Trace

    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=1, trace=10)
    for _ in thr.wrap(range(4)):
        with thr.section("forward"):
            dev.launch(0.001)
        with thr.section("backward"):
            dev.launch(0.002)
    trace = inside(thr).part(Trace)
    assert trace is not None
    spans = [e for e in trace.to_dict()["traceEvents"] if e.get("args", {}).get("section")]
    # (step 0 untimed, as device timing leaves it)
    expected = [(name, step) for step in range(1, 4) for name in ("forward", "backward")]
    assert [(e["name"], e["args"]["step"]) for e in spans] == expected
    assert [e["dur"] for e in spans[:2]] == pytest.approx([1000.0, 2000.0])


@pytest.mark.cuda
def test_a_cuda_steps_sections_add_up_to_its_sampled_device_time() -> None:
    torch = pytest.importorskip("torch")
    a = torch.randn(4096, 4096, device="cuda")
    thr = at.Throttle(2, device="cuda", sample_every=1)
    syncs_before = torch.cuda.get_sync_debug_mode()
    for _ in thr.wrap(range(40)):
        with thr.section("one"):
            b = a @ a
        with thr.section("two"):
            c = b @ a
            c = c @ a
    stats = thr.stats
    assert syncs_before == torch.cuda.get_sync_debug_mode()
    assert stats.sections is not None and stats.device_ms_p50 is not None
    assert sum(stats.sections.values()) == pytest.approx(stats.device_ms_p50, rel=0.10)
    assert stats.sections["two"] == pytest.approx(2 * stats.sections["one"], rel=0.15)


class _Marker:
    """A JAX array's stand-in on a :class:`FakeDevice`: computed when the device reaches it."""

    def __init__(self, dev: FakeDevice) -> None:
        self.dev, self.at = dev, max(dev.busy_until, dev.clock())

    def is_ready(self) -> bool:
        return self.dev.clock() >= self.at

    def is_deleted(self) -> bool:
        return False

    def block_until_ready(self) -> None:
        self.dev.clock.advance(max(0.0, self.at - self.dev.clock()))


def _host_dated(dev: FakeDevice) -> Any:
    """JAX's events on a fake device: each dated when the host first sees it complete."""
    from asyncthrottle.backends.jax import JaxEvent

    return functools.partial(JaxEvent, dev, _Marker, dev.clock)


def _two_phases(wait: str, host_s: float, depth: int = 2) -> at.Throttle:
    dev = FakeDevice()
    thr = at.Throttle(depth, events=_host_dated(dev), wait=dev.wait(wait), clock=dev.clock,
                      sample_every=1)
    for _ in thr.wrap(range(12)):
        with thr.section("one"):
            dev.launch(0.012)
        with thr.section("three"):
            dev.launch(0.036)
        dev.host(host_s)
    return thr


@pytest.mark.parametrize("wait", ["block", "spin-block", "spin"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_sections_dated_by_the_host_read_the_phases_when_the_host_waits(wait: str, depth: int) -> None:
    """JAX dates a marker when the host first sees it complete; a section's pair was first seen in
    one poll, at the step's retirement, and read ~0 ms. The step's event now dates them in order as
    the host waits on it: a device-bound loop reads each phase within the host's time per step."""
    sections = _two_phases(wait, host_s=0.001, depth=depth).stats.sections
    assert sections is not None
    assert sections["one"] == pytest.approx(12.0, abs=1.0) and sections["three"] == pytest.approx(36.0, abs=1.0)


@pytest.mark.parametrize("wait", ["block", "poll", "hybrid", "spin-block", "spin"])
def test_a_section_dated_by_the_host_is_within_a_tenth_of_the_phase_or_nan(wait: str) -> None:
    """However the host waits and however busy it is, a figure is the phase's time within 10%, or
    NaN where the host did not see the markers complete apart: never a small number."""
    timed = 0
    for depth in (1, 2, 3):
        for host_s in (0.0, 0.001, 0.010, 0.030, 0.045, 0.060, 0.100):
            sections = _two_phases(wait, host_s, depth).stats.sections
            assert sections is not None
            for name, truth in (("one", 12.0), ("three", 36.0)):
                ms = sections[name]
                assert math.isnan(ms) or ms == pytest.approx(truth, rel=0.1), (depth, host_s, name, ms)
                timed += not math.isnan(ms)
    assert timed >= 12  # (device-bound loops read their phases)


def test_sections_the_host_did_not_see_apart_are_nan_and_the_summary_says_why() -> None:
    """A host-bound loop never waits: every marker of a step is first seen complete in one poll, so
    a phase cannot be timed. NaN, never a small number."""
    thr = _two_phases("block", host_s=0.100)
    sections = thr.stats.sections
    assert sections is not None and math.isnan(sections["one"]) and math.isnan(sections["three"])
    summary = thr.summary()
    assert "section one: not timed (NaN)" in summary and "saw its start and end complete together" in summary
    assert math.isnan(thr.stats.as_dict()["section_ms_three"])


def test_listeners_hear_only_the_timed_sections_and_nan_own_work() -> None:
    dev = FakeDevice()
    thr = at.Throttle(2, events=_host_dated(dev), wait=dev.wait("block"), clock=dev.clock, sample_every=1)
    heard: list[tuple[float, dict[str, float]]] = []

    class Listening:
        def on_sections(self, step: int, own_s: float, seconds: dict[str, float]) -> None:
            heard.append((own_s, seconds))

    thr.subscribe(Listening())
    for _ in thr.wrap(range(4)):
        with thr.section("one"):
            dev.launch(0.012)
        dev.host(0.100)  # the host is busy: never sees the section's pair apart
    assert heard and all(math.isnan(own) and by_name == {} for own, by_name in heard)


def test_sample_every_none_times_no_sections_on_the_cpu_either() -> None:
    """``sample_every=None`` is no device timing and no sections, on every backend: code run on the
    CPU first reports what it will report on an accelerator."""
    clock = FakeClock()
    thr = at.Throttle(2, device="cpu", clock=clock, sample_every=None)
    for _ in thr.wrap(range(4)):
        with thr.section("forward"):
            clock.advance(0.004)
    assert thr.stats.sections is None and "section" not in thr.summary()
