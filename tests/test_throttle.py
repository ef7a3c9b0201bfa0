"""A throttle's life: close() and `with Throttle(...)`, the calls a closed throttle refuses, and a dropped
throttle freed at once, by reference counting alone (no reference cycle holds it or its parts)."""

from __future__ import annotations

import gc
import io
import re
import subprocess
import sys
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.parts import PARTS
from asyncthrottle.parts.sections import Sections
from asyncthrottle.testing import FakeDevice
from asyncthrottle.values import Completions


def _steps(dev: FakeDevice, thr: at.Throttle, n: int, device_s: float = 0.010) -> None:
    for i in range(n):
        with thr.step():
            dev.launch(device_s)
            thr.defer(float(i), name="loss")


def test_close_waits_for_the_recorded_steps_delivers_their_values_and_is_idempotent() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    heard: list[int] = []
    thr.on_complete(lambda step, values: heard.append(step))
    _steps(dev, thr, 5)
    assert thr.in_flight > 0
    thr.close()
    assert heard == [0, 1, 2, 3, 4] and thr.latest == {"loss": 4.0}
    assert thr.in_flight == 0 and thr.stats.completed == 5
    syncs = dev.syncs
    thr.close()  # nothing more to do
    assert dev.syncs == syncs and repr(thr).endswith(", closed)")


# each call, and the name its error gives it
_CLOSED_CALLS: dict[str, tuple[str, Callable[[at.Throttle], Any]]] = {
    "wrap()": ("wrap()", lambda thr: thr.wrap(range(3))),
    "begin_step()": ("begin_step()", lambda thr: thr.begin_step()),
    "step()": ("begin_step()", lambda thr: thr.step().__enter__()),
    "end_step()": ("end_step()", lambda thr: thr.end_step()),
    "mark()": ("mark()", lambda thr: thr.mark()),
    "drain()": ("drain()", lambda thr: thr.drain()),
    "pause()": ("pause()", lambda thr: thr.pause()),
    "defer()": ("defer()", lambda thr: thr.defer(1.0, name="loss")),
    "on_complete()": ("on_complete()", lambda thr: thr.on_complete(print)),
    "section()": ("section()", lambda thr: thr.section("backward")),
    "subscribe()": ("subscribe()", lambda thr: thr.subscribe(object())),
}


@pytest.mark.parametrize("call", list(_CLOSED_CALLS), ids=str)
def test_a_closed_throttle_refuses_each_call_that_would_change_it_naming_the_call_and_the_fix(call: str) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    _steps(dev, thr, 3)
    thr.close()
    named, make = _CLOSED_CALLS[call]
    with pytest.raises(RuntimeError, match=rf"^{re.escape(named)} on a closed Throttle: .*make a new Throttle"):
        make(thr)


def test_a_view_made_before_close_and_a_section_made_before_refuse_too() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    view = thr.wrap(range(3))
    with thr.step():
        forward = thr.section("forward")
    thr.close()
    with pytest.raises(RuntimeError, match="wrapped loop on a closed Throttle"):
        next(iter(view))
    with pytest.raises(RuntimeError, match=r"section\(\) on a closed Throttle"):
        thr.section("forward")
    with pytest.raises(RuntimeError, match=r"section\('forward'\) on a closed Throttle"):
        forward.__enter__()


def test_a_closed_throttle_stays_readable(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, trace=16)
    _steps(dev, thr, 3)
    thr.close()
    assert thr.stats.steps == 3 and "3 steps" in thr.summary() and thr.latest == {"loss": 2.0}
    assert thr.depth == 2 and thr.in_flight == 0 and thr.sync_audit is None and not thr.synchronous
    thr.export_trace(tmp_path / "trace.json")
    assert (tmp_path / "trace.json").stat().st_size > 0


def test_close_with_a_step_open_raises_and_leaves_the_throttle_open() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    thr.begin_step()
    with pytest.raises(RuntimeError, match=r"close\(\) was called with a step open; call end_step\(\) first"):
        thr.close()
    thr.end_step()
    thr.close()
    assert thr.stats.steps == 1


def test_close_in_a_wrapped_loop_records_its_step_and_the_loop_raises_at_its_next_batch() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    seen = []
    with pytest.raises(RuntimeError, match="next batch of a wrapped loop on a closed Throttle"):
        for batch in thr.wrap(range(5)):
            dev.launch(0.010)
            seen.append(batch)
            if batch == 1:
                thr.close()
    assert seen == [0, 1] and thr.stats.steps == 2 and thr.stats.completed == 2


def _closes_at(thr: at.Throttle, last: int, heard: list[int], step: int, values: dict[str, Any]) -> None:
    heard.append(step)
    if step == last:
        thr.close()  # training stopped from the logger


def test_close_in_an_on_complete_callback_ends_a_synchronous_loop_as_a_break_would() -> None:
    """On the CPU a step's values arrive in the next() that records it: the close there ends that next(),
    with no error, no batch handed out after it and no step recorded twice."""
    pytest.importorskip("torch")  # (the CPU backend's)
    thr = at.Throttle(2, device="cpu")
    heard: list[int] = []
    thr.on_complete(partial(_closes_at, thr, 2, heard))
    view = thr.wrap(range(10))
    seen = []
    for batch in view:
        thr.defer(float(batch), name="loss")
        seen.append(batch)
    assert seen == [0, 1, 2] and heard == [0, 1, 2] and thr.latest == {"loss": 2.0}
    assert thr.stats.steps == 3 and repr(thr).endswith(", closed)")
    with pytest.raises(RuntimeError, match="wrapped loop on a closed Throttle"):
        next(iter(view))


@pytest.mark.parametrize(("depth", "last", "seen"), [
    (2, 2, 4),  # step 2 completes as batch 4 is admitted: batch 4 is never handed out
    (1, 2, 3),
    (None, 2, 10),  # nothing completes before the end: the pass's own drain delivers, and closes
])
def test_close_in_an_on_complete_callback_ends_a_loop_as_a_break_would(depth: int | None, last: int,
                                                                       seen: int) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth)
    heard: list[int] = []
    thr.on_complete(partial(_closes_at, thr, last, heard))
    body = []
    for batch in thr.wrap(range(10)):
        dev.launch(0.010)
        thr.defer(float(batch), name="loss")
        body.append(batch)
    assert body == list(range(seen)) and heard[-1] == last
    # the step that ran last is recorded once (never a step the loop did not run), and drained
    assert thr.stats.steps == seen and thr.stats.completed == seen and thr.in_flight == 0
    assert repr(thr).endswith(", closed)")


def test_a_with_block_closes_the_throttle_at_its_end() -> None:
    dev = FakeDevice()
    with dev.throttle(2) as thr:
        for _ in thr.wrap(range(3), progress=False):
            dev.launch(0.010)
            thr.defer(1.0, name="loss")
        thr.begin_step()
        dev.launch(0.010)
        thr.end_step()
    assert thr.stats.completed == 4 and thr.latest == {"loss": 1.0}
    with pytest.raises(RuntimeError, match="closed"):
        thr.begin_step()


def test_a_with_block_left_by_an_error_drops_the_open_step_and_waits_for_nothing() -> None:
    """As ``step()`` does for its block: the error goes on at once, the steps in flight are not waited for."""
    dev = FakeDevice()
    dropped = []

    class Drops:
        def on_drop(self, step: int) -> None:
            dropped.append(step)

    with pytest.raises(KeyError, match="the body's"):
        with dev.throttle(4) as thr:
            thr.subscribe(Drops())
            _steps(dev, thr, 3, device_s=1.0)
            thr.begin_step()
            raise KeyError("the body's")
    assert dropped == [3] and thr.stats.waits == 0 and thr.stats.completed == 0 and dev.syncs == 0
    with pytest.raises(RuntimeError, match="closed"):
        thr.begin_step()


def _every_part(dev: FakeDevice) -> at.Throttle:
    """A throttle with every part that builds on a fake device (and a pass with a progress bar, sections,
    values, callbacks, a memory budget, the NaN watch, samples a second)."""
    thr = dev.throttle("auto", sample_every=2, trace=64, stall=5.0, nonfinite="raise",
                       max_memory=at.MemoryBudget(1 << 30, probe=lambda: 0), batch_size="auto")
    thr.on_complete(lambda step, values: None)
    for i in thr.wrap(range(12), progress={"file": io.StringIO()}):  # (the bar hears the hand-outs)
        with thr.section("forward"):
            dev.launch(0.010)
        thr.defer(float(i), name="loss")
        if i == 10:
            break
    with thr.step():
        dev.launch(0.010)
    return thr


def _ours(obj: object) -> bool:
    """An object of the package, or a bound method of one."""
    owner = getattr(obj, "__self__", None) if type(obj).__name__ == "method" else obj
    return (getattr(type(owner), "__module__", None) or "").startswith("asyncthrottle")


def _in_cycles() -> list[str]:
    """The classes of the package's objects that only the cyclic garbage collector would free now."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted({type(obj).__qualname__ for obj in gc.garbage if _ours(obj)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("closed", [False, True], ids=["dropped", "closed, then dropped"])
def test_a_dropped_throttle_and_its_parts_are_freed_without_the_garbage_collector(no_gc: None, closed: bool) -> None:
    dev = FakeDevice()
    thr = _every_part(dev)
    built = [kind for kind in PARTS if inside(thr).part(kind) is not None]
    assert len(built) >= 9, f"every part of a fake device should be on, got {built}"
    if closed:
        thr.close()
    ref = weakref.ref(thr)
    del thr
    assert ref() is None
    assert _in_cycles() == []


def test_a_dropped_cpu_throttle_and_a_dropped_framework_callback_are_freed_without_the_garbage_collector(
        no_gc: None) -> None:
    pytest.importorskip("torch")  # (the CPU backend's)
    thr = at.Throttle(2, device="cpu")
    for i in thr.wrap(range(3)):
        thr.defer(float(i))
    hooks = ThrottleHooks(2, events=FakeDevice().event, nonfinite="raise")
    hooks.on_complete(lambda step, values: None)  # (the callback hears the framework's numbers)
    hooks.begin(100)
    hooks.end(1.0)
    refs = [weakref.ref(thr), weakref.ref(hooks.throttle), weakref.ref(hooks)]
    del thr, hooks
    assert [ref() for ref in refs] == [None, None, None]
    assert _in_cycles() == []


def test_dropped_throttles_their_callbacks_refer_to_are_freed_by_the_collector_and_released(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A callback that holds its throttle (to close it, to read its stats) makes a reference cycle; the
    collector frees it only if nothing global (the finalizer's arguments, the lifecycles' registry) holds
    a way to the throttle, and the release still runs: the parts' timing events, the values' ring."""
    released: list[int] = []
    close = Completions.close
    monkeypatch.setattr(Completions, "close", lambda values: (released.append(1), close(values))[1])
    dev = FakeDevice()
    refs, held = [], []
    for _ in range(20):
        thr = _every_part(dev)
        thr.on_complete(partial(_closes_at, thr, -1, []))
        parts = inside(thr).life
        # what the release empties (and which holds no way to the throttle)
        held.append((parts.part(Sections).waiting, parts.part(at.parts.timing.DeviceTiming).ends))
        assert all(held[-1]), "every throttle holds timing events to release"
        refs.append(weakref.ref(thr))
        del thr, parts
    gc.collect()
    assert [ref() for ref in refs] == [None] * 20
    assert len(released) == 20 and not any(any(kept) for kept in held)


def test_the_throttle_that_first_imports_torch_is_freed_without_the_garbage_collector() -> None:
    """torch's import leaves frames in reference cycles, and a frame holds its callers: a throttle
    built before the script imported torch must not be kept alive by its own constructor's frames."""
    pytest.importorskip("torch")
    script = (
        "import gc, sys, weakref\n"
        "gc.disable()\n"
        "import asyncthrottle as at\n"
        "assert 'torch' not in sys.modules\n"
        "thr = at.Throttle(2)\n"
        "for i in thr.wrap(range(3)):\n"
        "    thr.defer(float(i))\n"
        "assert 'torch' in sys.modules\n"
        "ref = weakref.ref(thr)\n"
        "del thr\n"
        "print('freed' if ref() is None else 'alive')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "freed"


def test_a_value_kept_after_its_throttle_was_dropped_still_waits_for_its_step(no_gc: None) -> None:
    """A kept Deferred holds no throttle (its wait holds the core): the throttle goes, and the value still
    waits for its own step's event."""
    dev = FakeDevice()
    thr = dev.throttle(4)
    with thr.step():
        dev.launch(1.0)
        loss = thr.defer(7.0, name="loss")
    ref = weakref.ref(thr)
    del thr
    assert ref() is None and not loss.ready()
    assert loss.get() == 7.0 and dev.clock() >= 1.0


def test_closing_releases_what_the_parts_hold() -> None:
    dev = FakeDevice()
    thr = _every_part(dev)
    sections: Sections = inside(thr).part(Sections)
    timing = inside(thr).part(at.parts.timing.DeviceTiming)
    assert sections.made and timing.ends
    thr.close()
    assert not sections.made and not sections.waiting and not timing.ends
    assert inside(thr).core.on_record == [] and inside(thr).core.supplier is None


def test_the_callbacks_close_closes_their_throttle() -> None:
    hooks = ThrottleHooks(2, events=FakeDevice().event)
    hooks.begin()
    hooks.close()  # the open step is dropped: a callback whose training stopped
    assert hooks.throttle.stats.steps == 0 and not hooks.step_open
    hooks.close()
    with pytest.raises(RuntimeError, match=r"begin_step\(\) on a closed Throttle"):
        hooks.begin()
