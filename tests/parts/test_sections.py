"""Sections: pairs of pooled timing events read at retirement (never a sync), the host clock when synchronous."""

from __future__ import annotations

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
    assert part is not None and not part.subscribed and thr.stats.sections is None


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
