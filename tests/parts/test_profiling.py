"""The throttle's waits in torch.profiler (record_function ranges) and in Nsight (NVTX ranges, with a fake)."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.profiling import NvtxRanges
from asyncthrottle.testing import FakeDevice

torch = pytest.importorskip("torch")
MS = 1e-3


def _profiled_names(run: Any) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return [e.name for e in prof.events() if e.name.startswith("asyncthrottle")]


def test_waits_appear_in_a_torch_profiler_trace() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin")

    def run() -> None:
        for _ in thr.wrap(range(4)):
            dev.launch(10 * MS)  # depth 1: the host must wait for every step

    names = _profiled_names(run)
    assert thr.stats.waits == 4
    assert names == ["asyncthrottle.wait"] * 3 + ["asyncthrottle.drain"]


def test_no_wait_no_range() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4, wait="spin", drain=False)

    def run() -> None:
        for _ in thr.wrap(range(3)):
            dev.launch(10 * MS)  # depth 4: three steps never make the host wait

    assert _profiled_names(run) == [] and thr.stats.waits == 0


def test_without_a_profiler_no_range_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("record_function made with no profiler active")

    monkeypatch.setattr(torch.autograd.profiler, "record_function", refuse)
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin")
    for _ in thr.wrap(range(4)):
        dev.launch(10 * MS)
    assert thr.stats.waits == 4


def test_without_torch_loaded_waits_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")  # the hook looks torch up, never imports it
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin")
    for _ in thr.wrap(range(3)):
        dev.launch(10 * MS)
    assert thr.stats.waits == 3


def test_without_torch_a_wait_tells_no_range_hook_until_torch_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as patch:
        patch.delitem(sys.modules, "torch")  # a JAX program: torch never loaded
        dev = FakeDevice()
        thr = dev.throttle(1, wait="spin")
        core = inside(thr).core
        assert not any("ProfilerRanges" in repr(hook) for hook in core.on_wait_begin + core.on_wait)
        for _ in thr.wrap(range(2)):
            dev.launch(10 * MS)
    assert not any("ProfilerRanges" in repr(hook) for hook in core.on_wait_begin + core.on_wait)
    # torch is loaded now: the end of the next pass makes the part listen, the pass after is
    # profiled
    for _ in thr.wrap(range(2)):
        dev.launch(10 * MS)

    def run() -> None:
        for _ in thr.wrap(range(3)):
            dev.launch(10 * MS)

    assert _profiled_names(run) == ["asyncthrottle.wait"] * 2 + ["asyncthrottle.drain"]


def test_a_wait_that_times_out_still_closes_its_range() -> None:
    class Never:
        def record(self) -> None:
            pass

        def query(self) -> bool:
            return False

        def synchronize(self) -> None:
            pass

    clock = FakeDevice().clock
    thr = at.Throttle(1, events=Never, wait=at.Spin(clock=lambda: clock.advance(1e-3) or clock()), timeout=0.01,
                      clock=clock)

    def run() -> None:
        with pytest.raises(at.ThrottleTimeout):
            for _ in thr.wrap(range(3)):
                pass

    assert _profiled_names(run) == ["asyncthrottle.wait"]
    assert _profiled_names(lambda: None) == []  # nothing left open for the next session


class FakeNvtx:
    """Stands in for torch.cuda.nvtx: logs every call; ranges must balance."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.depth = 0
        self.open: set[int] = set()
        self._next = 0

    def range_push(self, msg: str) -> int:
        self.calls.append(("push", msg))
        self.depth += 1
        return self.depth - 1

    def range_pop(self) -> int:
        self.calls.append(("pop", None))
        assert self.depth > 0, "pop without push"
        self.depth -= 1
        return self.depth

    def range_start(self, msg: str) -> int:
        self._next += 1
        self.calls.append(("start", msg))
        self.open.add(self._next)
        return self._next

    def range_end(self, handle: int) -> None:
        self.calls.append(("end", handle))
        self.open.remove(handle)


def test_nvtx_ranges_for_steps_and_waits() -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin")
    nvtx = FakeNvtx()
    thr.subscribe(NvtxRanges(inside(thr).core, nvtx))
    for _ in thr.wrap(range(3)):
        dev.launch(10 * MS)
    assert nvtx.calls == [
        ("start", "asyncthrottle.step 0"), ("end", 1),
        ("push", "asyncthrottle.wait"), ("pop", None), ("start", "asyncthrottle.step 1"), ("end", 2),
        ("push", "asyncthrottle.wait"), ("pop", None), ("start", "asyncthrottle.step 2"), ("end", 3),
        ("push", "asyncthrottle.drain"), ("pop", None),
    ]
    assert nvtx.depth == 0 and not nvtx.open


def test_nvtx_closes_the_range_of_a_step_that_raised() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin")
    nvtx = FakeNvtx()
    thr.subscribe(NvtxRanges(inside(thr).core, nvtx))
    with pytest.raises(KeyError):
        for step in thr.wrap(range(5)):
            if step == 1:
                raise KeyError(step)  # the pass records the step it leaves
    with pytest.raises(KeyError), thr.step():
        raise KeyError("a failed step() records nothing: its range closes when it is dropped")
    assert not nvtx.open
    for _ in thr.wrap(range(1)):
        pass
    assert [c for c in nvtx.calls if c[0] == "start"] == [("start", f"asyncthrottle.step {n}") for n in (0, 1, 2, 2)]
    assert not nvtx.open and nvtx.depth == 0


def test_throttle_nvtx_option_uses_torch_cuda_nvtx(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvtx()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("range_push", "range_pop", "range_start", "range_end"):
        monkeypatch.setattr(torch.cuda.nvtx, name, getattr(fake, name))
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", nvtx=True)
    for _ in thr.wrap(range(2)):
        dev.launch(MS)
    assert ("push", "asyncthrottle.wait") in fake.calls and ("start", "asyncthrottle.step 1") in fake.calls
    assert fake.depth == 0 and not fake.open


def test_nvtx_without_cuda_warns_once_at_the_users_line_and_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """As detect_sync= does: a script written for a GPU runs on a laptop."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match=r"nvtx=True needs CUDA .*custom events= backend without CUDA, so nvtx "
                                            r"is off") as caught:
        thr = FakeDevice().throttle(2, nvtx=True)
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(thr.wrap(range(3))) == [0, 1, 2]  # no warning per step
    with pytest.warns(RuntimeWarning, match="the device here is cpu without CUDA"):
        at.Throttle(2, device="cpu", nvtx=True)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_bad_nvtx_values(bad: object) -> None:
    with pytest.raises(TypeError, match=r"nvtx must be True or False, got " + repr(bad)):
        at.Throttle(2, device="cpu", nvtx=bad)  # type: ignore[arg-type]
