"""The sync audit: every step from hand-out to the next wait, the loop's thread only, named by site."""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.backends import torch as torch_backend
from asyncthrottle.core.waits import Poll
from asyncthrottle.parts.syncaudit import SYNC_MESSAGE, SyncAudit, site_of
from asyncthrottle.testing import FakeDevice


class FakeCuda:
    """torch.cuda's sync debug mode switches: the audit runs on the CPU with injected sync warnings."""

    def __init__(self) -> None:
        self.mode: Any = 0
        self.history: list[Any] = []

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode
        self.history.append(mode)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(torch_backend, "cuda_module", lambda: fake)
    return fake


def sync_here() -> None:
    """A fake sync site: warns exactly as torch does under ``set_sync_debug_mode("warn")``."""
    warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)


def other_site() -> None:
    warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)


def line_of(func: Any, marker: str) -> int:
    """The line in this file of the first source line of ``func`` that contains ``marker``.

    Not ``co_firstlineno`` plus an offset: for a decorated function that is the decorator's line.
    """
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, text in enumerate(lines) if marker in text)


SITE = f"test_syncdetect.py:{sync_here.__code__.co_firstlineno + 2}"
OTHER = f"test_syncdetect.py:{other_site.__code__.co_firstlineno + 1}"


class SyncingWait(Poll):
    """A wait strategy whose waits sync (they are host-device syncs): the audit must never count them."""

    def __call__(self, event: Any, timeout: float | None) -> bool:
        sync_here()
        return super().__call__(event, timeout)


def _throttle(dev: FakeDevice, depth: int = 1) -> at.Throttle:
    return at.Throttle(depth, events=dev.event, clock=dev.clock, detect_sync="warn",
                       wait=SyncingWait(clock=dev.clock, sleep=dev.clock.sleep, spin_s=0.0))


def test_a_wrapped_loop_counts_the_body_and_the_fetch_but_never_the_waits(cuda: FakeCuda) -> None:
    dev = FakeDevice()
    thr = _throttle(dev)

    def source() -> Iterator[int]:
        for i in range(4):
            other_site()  # the framework's code between steps (fetching the next batch)
            yield i

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        for _ in thr.wrap(source()):
            assert cuda.mode == "warn"
            sync_here()
            sync_here()
            dev.launch(0.01)
    assert thr.stats.waits == 4  # depth 1: three waits for room and the drain ran (and warned), outside the windows
    audit = thr.sync_audit
    assert audit is not None and audit.steps == 4
    # every step's body (2 each) and the fetches after steps 0..2 (the first fetch precedes the first hand-out)
    assert dict(audit.sites) == {SITE: 8, OTHER: 3} and audit.syncs_per_step == 11 / 4
    counted = [w for w in shown if "asyncthrottle: site" in str(w.message)]
    assert len(counted) == 2  # the first of each site is shown, the rest only counted
    waits = [w for w in shown if str(w.message) == SYNC_MESSAGE]
    assert len(waits) == 4 + 1  # the waits' own syncs pass through, uncounted (+1: the first fetch)
    assert cuda.mode == 0 and cuda.history[-1] == 0


def test_begin_end_steps_cover_the_code_after_end_step_until_the_next_wait(cuda: FakeCuda) -> None:
    dev = FakeDevice()
    thr = _throttle(dev, depth=2)
    for _ in range(3):
        thr.begin_step()
        sync_here()
        dev.launch(0.01)
        thr.end_step()
        other_site()  # a framework's logging after the end hook: still this step's
    assert cuda.mode == "warn"  # the last step's window is open until the throttle next waits ...
    thr.drain()
    assert cuda.mode == 0  # ... or drains
    other_site()  # outside any window: not counted
    audit = thr.sync_audit
    assert audit is not None and dict(audit.sites) == {SITE: 3, OTHER: 3} and audit.steps == 3
    summary = thr.summary()
    assert "2.0/step on the loop's thread over 3 steps" in summary
    assert f"1.0 syncs/step \u2014 {SITE}" in summary and f"1.0 syncs/step \u2014 {OTHER}" in summary


def test_the_audit_is_in_stats_and_the_summary_like_every_parts_fields(cuda: FakeCuda) -> None:
    """SyncDetect's STATS and summary_lines: stats, as_dict() (what a framework callback logs) and the
    summary carry the audit, as every part's fields; off, they hold none of it."""
    dev = FakeDevice()
    thr = _throttle(dev, depth=2)
    for _ in range(4):
        with thr.step():
            sync_here()
            sync_here()
            dev.launch(0.01)
    thr.drain()
    stats, audit = thr.stats, thr.sync_audit
    assert audit is not None
    assert (stats.sync_steps, stats.syncs, stats.syncs_per_step) == (4, 8, 2.0)
    assert stats.sync_sites == {SITE: 2.0}
    flat = stats.as_dict()
    assert {k: v for k, v in flat.items() if k.startswith("syncs_per_step")} == audit.as_dict()
    assert stats.summary().count("syncs (detect_sync)") == 1 and audit.summary() in thr.summary()
    quiet = at.Throttle(1, events=dev.event, detect_sync="error")
    assert quiet.stats.syncs_per_step is None and "syncs" not in quiet.summary()
    assert not any(k.startswith("sync") for k in quiet.stats.as_dict())


def test_a_failed_step_closes_its_window(cuda: FakeCuda) -> None:
    thr = _throttle(FakeDevice())
    with pytest.raises(KeyError), thr.step():
        sync_here()
        raise KeyError("in the body")
    assert cuda.mode == 0
    sync_here()
    assert thr.sync_audit is not None and thr.sync_audit.syncs == 1


def test_only_the_loops_thread_is_counted(cuda: FakeCuda) -> None:
    thr = _throttle(FakeDevice())
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        with thr.step():
            worker = threading.Thread(target=other_site)  # e.g. a DataLoader's pin-memory thread
            worker.start()
            worker.join()
            sync_here()
    audit = thr.sync_audit
    assert audit is not None and dict(audit.sites) == {SITE: 1}
    assert any(str(w.message) == SYNC_MESSAGE for w in shown)  # the other thread's sync is still reported


def test_the_audit_survives_catch_warnings_blocks_between_steps(cuda: FakeCuda) -> None:
    thr = _throttle(FakeDevice())
    for _ in range(3):
        with warnings.catch_warnings():  # resets filters and the handler, as pytest and libraries do
            warnings.simplefilter("ignore", DeprecationWarning)
            with thr.step():
                sync_here()
                sync_here()
    assert thr.sync_audit is not None and thr.sync_audit.sites[SITE] == 6


def test_no_syncs_and_error_mode_and_elsewhere(cuda: FakeCuda) -> None:
    thr = _throttle(FakeDevice())
    for _ in thr.wrap(range(2)):
        pass
    assert "none seen on the loop's thread in 2 steps" in thr.summary()
    strict = at.Throttle(1, events=FakeDevice().event, detect_sync="error")
    assert strict.sync_audit is None  # torch raises at the site itself
    with strict.step():
        assert cuda.mode == "error"
    assert cuda.mode == "error"  # a step() loop's last window stays open until the next wait ...
    strict.drain()
    assert cuda.mode == 0  # ... or drain()


def test_without_cuda_it_warns_once_and_audits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_backend, "cuda_module", lambda: None)
    with pytest.warns(RuntimeWarning, match="custom events= backend without CUDA, so detect_sync is off") as caught:
        thr = at.Throttle(1, events=FakeDevice().event, detect_sync="warn")
    assert len(caught) == 1 and caught[0].filename == __file__  # at the user's line, as nvtx=True's
    assert thr.sync_audit is None and "syncs" not in thr.summary()


def test_sites_skip_torch_frames() -> None:
    torch = pytest.importorskip("torch")
    audit = SyncAudit()
    namespace: dict[str, Any] = {"warnings": warnings, "SYNC_MESSAGE": SYNC_MESSAGE}
    exec(compile("def inside_torch():\n    warnings.warn(SYNC_MESSAGE, UserWarning)\n", torch._tensor.__file__,
                 "exec"), namespace)
    audit.start()
    try:
        namespace["inside_torch"]()  # a sync raised inside torch's own Python code: named by its caller
    finally:
        audit.stop()
    line = test_sites_skip_torch_frames.__code__.co_firstlineno + 8
    assert dict(audit.sites) == {f"test_syncdetect.py:{line}": 1}
    assert site_of(None) == "<unknown>"


@pytest.mark.cuda
def test_a_real_item_is_counted_per_step_at_its_line() -> None:
    torch = pytest.importorskip("torch")
    x = torch.ones(8, device="cuda")
    thr = at.Throttle(2, device="cuda", detect_sync="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in thr.wrap(range(4)):
            (x * 2).sum().item()  # host-device sync, on purpose
    line = line_of(test_a_real_item_is_counted_per_step_at_its_line, "(x * 2).sum().item()")
    audit = thr.sync_audit
    assert audit is not None and audit.sites[f"test_syncdetect.py:{line}"] == 4 and audit.steps == 4
    assert torch.cuda.get_sync_debug_mode() == 0


def test_line_of_finds_the_item_line_under_a_decorator() -> None:
    import linecache

    line = line_of(test_a_real_item_is_counted_per_step_at_its_line, "(x * 2).sum().item()")
    assert "(x * 2).sum().item()" in linecache.getline(__file__, line)
    assert line != test_a_real_item_is_counted_per_step_at_its_line.__code__.co_firstlineno + 7  # the old guess


def test_a_drain_inside_a_step_audits_the_rest_of_the_step(fake_cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    mode = {"value": 0}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["value"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: mode.update(value=m))
    thr = at.Throttle(2, device="cuda", detect_sync="warn")
    thr.begin_step()
    assert mode["value"] == "warn"
    thr.drain()  # a checkpoint saved from inside the step: the throttle's own wait is not audited...
    assert mode["value"] == "warn"  # ...but the rest of the step is
    thr.end_step()
    thr.drain()
    assert mode["value"] == 0
