"""on_complete callbacks and deferred values at their edges: errors, removal, re-entry, failed records, threads."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.core.rule import Core
from asyncthrottle.testing import FakeDevice


def _throttle(depth: int | None = 2) -> tuple[FakeDevice, at.Throttle]:
    dev = FakeDevice()
    return dev, dev.throttle(depth)


def test_a_raising_callback_hides_the_step_from_no_other_callback() -> None:
    _dev, thr = _throttle(None)
    seen: list[int] = []

    @thr.on_complete
    def first(step: int, values: dict[str, Any]) -> None:
        raise ValueError(f"first callback at step {step}")

    thr.on_complete(lambda step, values: seen.append(step))
    with pytest.raises(ValueError, match="first callback at step 0"):
        for _ in thr.wrap(range(3)):
            thr.defer(1.0)
    assert seen == [0]  # the second callback heard of step 0 before the first error was raised
    thr.remove_on_complete(first)
    for _ in thr.wrap(range(1)):  # nothing lost: the loop goes on, the later steps arrive
        thr.defer(2.0)
    assert seen == [0, 1]


def test_removing_a_callback_from_inside_a_callback_skips_no_other() -> None:
    dev, thr = _throttle()
    seen: list[tuple[str, int]] = []

    def once(step: int, values: dict[str, Any]) -> None:
        seen.append(("once", step))
        thr.remove_on_complete(once)

    thr.on_complete(once)
    thr.on_complete(lambda step, values: seen.append(("always", step)))
    for _ in thr.wrap(range(3)):
        dev.launch(0.001)
    assert seen == [("once", 0), ("always", 0), ("always", 1), ("always", 2)]


@pytest.mark.parametrize("reenter", ["drain", "get"])
def test_callbacks_see_steps_in_order_even_when_one_waits(reenter: str) -> None:
    dev, thr = _throttle(None)
    seen: list[tuple[str, int]] = []
    later: list[at.Deferred] = []

    def first(step: int, values: dict[str, Any]) -> None:
        seen.append(("first", step))
        if step == 0:
            if reenter == "drain":
                thr.drain()  # retires steps 1..3 while step 0 is being delivered
            else:
                assert later[-1].get() == 3.0  # waits for step 3: the value arrives, its delivery waits its turn

    thr.on_complete(first)
    thr.on_complete(lambda step, values: seen.append(("second", step)))
    for i in range(4):
        with thr.step():
            dev.launch(0.001 if i == 0 else 0.010)
            later.append(thr.defer(float(i)))
    dev.host(0.002)  # step 0 is complete, steps 1..3 are not
    with thr.step():  # its hand-out retires step 0, whose first callback waits for the rest
        pass
    thr.drain()
    order = [step for _, step in seen]
    assert order == sorted(order)
    assert seen[:2] == [("first", 0), ("second", 0)]


def test_a_step_whose_record_failed_takes_its_values_with_it() -> None:
    dev = FakeDevice()
    fail = {"now": False}

    class Capturing(at.testing.FakeEvent):  # type: ignore[name-defined,misc]
        __slots__ = ()

        def record(self) -> None:
            if fail["now"]:
                raise RuntimeError("operation not permitted when stream is capturing")
            super().record()

    thr = at.Throttle(2, events=lambda: Capturing(dev), wait=dev.wait("poll"), clock=dev.clock)
    seen: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: seen.append((step, values.get("loss"))))
    with thr.step():
        thr.defer(0.0, name="loss")
    fail["now"] = True
    with pytest.raises(RuntimeError, match="capturing"), thr.step():
        lost = thr.defer(1.0, name="loss")
    fail["now"] = False
    with thr.step():
        thr.defer(2.0, name="loss")
    thr.drain()
    assert seen == [(0, 0.0), (1, 2.0)]  # a scalar, not [1.0, 2.0]: the failed step's value left with it
    assert not lost.ready()
    with pytest.raises(RuntimeError, match="will never arrive"):
        lost.get()


def test_get_of_a_dropped_value_never_runs_the_core_from_another_thread() -> None:
    dev, thr = _throttle()
    retired: list[int] = []
    thr.on_complete(lambda step, values: retired.append(step))
    with pytest.raises(KeyError), thr.step():
        dropped = thr.defer(1.0)
        raise KeyError("body")
    with thr.step():
        dev.launch(0.010)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            dropped.get()
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert len(errors) == 1 and "will never arrive" in str(errors[0])
    assert retired == [] and thr.stats.completed == 0  # the other thread retired nothing, ran no callback


def test_get_of_an_unrecorded_value_from_another_thread_raises_without_touching_the_core() -> None:
    _dev, thr = _throttle()
    thr.begin_step()
    pending = thr.defer(1.0)
    errors: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(pending.get, errors))
    reader.start()
    reader.join(timeout=10)
    assert len(errors) == 1 and "has not ended yet" in str(errors[0])
    thr.end_step()
    thr.drain()
    assert pending.get() == 1.0


def _catch(fn: Any, errors: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:
        errors.append(exc)


def test_default_names_do_not_collide_with_user_names() -> None:
    _dev, thr = _throttle()
    with thr.step():
        thr.defer(1.0, name="value_loss")
        first = thr.defer(2.0)
        thr.defer(3.0, name="value_2")
        second = thr.defer(4.0)
    thr.drain()
    assert (first.name, second.name) == ("value", "value_1")
    assert thr.latest == {"value_loss": 1.0, "value": 2.0, "value_2": 3.0, "value_1": 4.0}
    with thr.step():
        thr.defer(1.0, name="value_1")
        assert thr.defer(2.0).name == "value"
        assert thr.defer(3.0).name == "value_2"  # skips the user's value_1: no merged list


def test_a_user_name_equal_to_a_default_name_of_the_step_is_an_error() -> None:
    _dev, thr = _throttle()
    with thr.step():
        thr.defer(1.0)
        thr.defer(2.0)  # value_1
        with pytest.raises(ValueError, match="already has the default name 'value_1'"):
            thr.defer(3.0, name="value_1")


class _Batch:
    """A batch whose death a test can see (a weak reference)."""


def _batches(n: int, refs: list[weakref.ref[_Batch]]) -> Iterator[_Batch]:
    for _ in range(n):
        batch = _Batch()
        refs.append(weakref.ref(batch))
        yield batch


def _loop(dev: FakeDevice, thr: at.Throttle, refs: list[weakref.ref[_Batch]], nan: bool) -> None:
    """A wrapped loop, whose step 1 defers a NaN if ``nan`` (its locals die with the call)."""
    for i, _batch in enumerate(thr.wrap(_batches(8, refs))):
        dev.launch(0.010)
        thr.defer(float("nan") if nan and i == 1 else 1.0, name="loss")


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("device", ["fake", "cpu"])
@pytest.mark.parametrize("cause", ["on_complete", "nonfinite"])
def test_a_delivery_error_ends_the_pass_and_frees_its_batches_without_the_gc(cause: str, device: str) -> None:
    dev = FakeDevice()
    options: dict[str, Any] = {"nonfinite": "raise"} if cause == "nonfinite" else {}
    thr = dev.throttle(2, **options) if device == "fake" else at.Throttle(2, device="cpu", **options)
    if cause == "on_complete":
        def fail(step: int, values: dict[str, Any]) -> None:
            if step == 1:
                raise ValueError("the callback at step 1")

        thr.on_complete(fail)
    refs: list[weakref.ref[_Batch]] = []
    with pytest.raises(ValueError if cause == "on_complete" else at.NonFiniteError):
        _loop(dev, thr, refs, nan=cause == "nonfinite")
    steps = thr.stats.steps
    assert refs and [ref() for ref in refs] == [None] * len(refs)  # no cycle keeps a batch or the pass
    thr.pause()  # the pass has ended: not "inside a wrapped loop"
    with thr.step():
        thr.defer(2.0, name="loss")
    thr.drain()
    assert thr.latest["loss"] == 2.0
    gc.collect()  # the collector finds no pass left to end
    assert (thr.stats.steps, thr.in_flight) == (steps + 1, 0)


@pytest.mark.parametrize("device", ["fake", "cpu"])
def test_a_section_left_open_leaves_its_step_values_in_their_step(device: str) -> None:
    """The section's error at the record hides the record from no other part: step 1's NaN arrives as step 1's."""
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise") if device == "fake" else at.Throttle(2, device="cpu", nonfinite="raise")
    got: list[tuple[int, Any]] = []
    raised: list[str] = []
    for i in range(3):
        try:
            with thr.step():
                forward = thr.section("forward")
                forward.__enter__()
                if i == 0:  # the usual order: the first section before the first defer or callback
                    thr.on_complete(lambda step, values: got.append((step, values.get("loss"))))
                dev.launch(0.010)
                thr.defer(float("nan") if i == 1 else float(i), name="loss")
                if i != 1:
                    forward.__exit__(None, None, None)  # step 1 leaves it open
        except (RuntimeError, FloatingPointError) as exc:
            raised.append(f"{type(exc).__name__} at {i}")
    try:
        thr.drain()
    except at.NonFiniteError as exc:
        raised.append(f"NonFiniteError of {exc.step} in drain")
    thr.drain()  # the steps after the error's
    assert [(step, repr(value)) for step, value in got] == [(0, "0.0"), (1, "nan"), (2, "2.0")]  # not (2, [nan, 2.0])
    assert thr.stats.nonfinite_first == 1
    assert raised[0] == "RuntimeError at 1"  # the open section, at its step's record


class _Interrupting:
    """A part told of retirements before the values' part (device timing, sections, a user's Subscriber) that
    Ctrl-C lands in at step 1."""

    def __init__(self) -> None:
        self.heard: list[int] = []

    def on_retire(self, step: int) -> None:
        self.heard.append(step)
        if step == 1 and self.heard.count(1) == 1:
            raise KeyboardInterrupt


@pytest.mark.parametrize("device", ["fake", "cpu"])
def test_ctrl_c_in_an_earlier_retire_hook_loses_no_value(device: str) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2) if device == "fake" else at.Throttle(2, device="cpu")
    early = _Interrupting()
    thr.subscribe(early)  # before the values' part, which subscribes with the first callback
    got: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: got.append((step, values.get("loss"))))
    deferred: list[float] = []
    with pytest.raises(KeyboardInterrupt):
        for i in thr.wrap(range(4)):
            dev.launch(0.010)
            deferred.append(float(i))
            thr.defer(float(i), name="loss")
    assert got[-1] == (1, 1.0)  # the values' part heard of step 1 before the interrupt went on
    for i in thr.wrap(range(4, 6)):  # the program goes on (a notebook cell run again)
        dev.launch(0.010)
        deferred.append(float(i))
        thr.defer(float(i), name="loss")
    assert got == list(enumerate(deferred))  # every step, in order, with its own value
    assert thr.latest == {"loss": 5.0}
    assert early.heard == list(range(len(deferred)))


def test_ctrl_c_between_a_retirement_and_its_telling_loses_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt that lands as the core starts telling a step (at the call): the values' part delivers that
    step when told of the next one, in order."""
    dev, thr = _throttle(2)
    got: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: got.append((step, values.get("loss"))))
    tell = Core.tell_retired

    def interrupted(core: Core, step: int) -> None:
        if step == 1 and not interrupted.fired:  # type: ignore[attr-defined]
            interrupted.fired = True  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        tell(core, step)

    interrupted.fired = False  # type: ignore[attr-defined]
    monkeypatch.setattr(Core, "tell_retired", interrupted)
    deferred: list[float] = []
    with pytest.raises(KeyboardInterrupt):
        for i in thr.wrap(range(4)):
            dev.launch(0.010)
            deferred.append(float(i))
            thr.defer(float(i), name="loss")
    thr.drain()
    assert got == list(enumerate(deferred))  # every step, in order, with its own value
    assert len(got) > 2 and thr.latest == {"loss": deferred[-1]}
