"""Deferred JAX arrays on the real runtime: held, not copied; a donation loses a value loudly, at a defined point.

The steps' events are a FakeDevice's, so when a step completes is the test's choice;
the arrays, the jitted calls and their donations are real JAX (XLA on the CPU).
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
np = pytest.importorskip("numpy")

import asyncthrottle as at  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402
from asyncthrottle.values import DonatedValueError  # noqa: E402

pytestmark = pytest.mark.jax

_donating = jax.jit(lambda state: state + 1.0, donate_argnums=0)


def _state() -> Any:
    return jnp.zeros((4,), jnp.float32) + 0.0  # a fresh buffer the test may donate


def test_a_deferred_array_is_held_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    copies: list[int] = []
    dev = FakeDevice()
    thr = dev.throttle(2)
    loss = jnp.float32(1.5) + 0.0
    original = type(loss).copy
    monkeypatch.setattr(type(loss), "copy", lambda self: copies.append(1) or original(self))
    with thr.step():
        deferred = thr.defer(loss, name="loss")
    thr.drain()
    assert copies == []  # no device copy per step
    assert deferred.get() == 1.5 and thr.latest["loss"] == 1.5
    with thr.step():
        thr.defer(loss, name="loss", copy=True)
    assert copies == [1]  # the opt-in copy


def test_a_value_read_before_the_donation_survives_it() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    state = _state()
    with thr.step():
        first = thr.defer(state, name="state")
    dev.launch(0.0)  # step 0 is complete: the next hand-out retires it and reads the array
    with thr.step():
        state = _donating(state)  # donates the array step 0 deferred, after step 0 was read
    thr.drain()
    assert first.get().tolist() == [0.0] * 4
    assert thr.latest["state"].tolist() == [0.0] * 4


def test_the_host_copy_of_a_cpu_array_owns_its_data_so_a_later_donation_happens() -> None:
    thr = FakeDevice().throttle(2)
    state = _state()
    with thr.step():
        deferred = thr.defer(state, name="state")
    thr.drain()
    host = deferred.get()
    assert host.flags.owndata  # np.asarray would be a view that silently blocks the donation below
    _donating(state)
    assert state.is_deleted()
    assert host.tolist() == [0.0] * 4


def test_an_array_donated_before_its_step_completed_raises_naming_the_step_the_value_and_the_fix() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    dev.launch(1.0)  # the steps below stay unfinished until the clock moves
    state = _state()
    got: list[tuple[int, dict[str, Any]]] = []
    thr.on_complete(lambda step, values: got.append((step, values)))
    with thr.step():
        lost = thr.defer(state, name="state")
        kept = thr.defer(jnp.float32(2.0) + 0.0, name="loss")
    with thr.step():
        state = _donating(state)  # step 1 donates what step 0 deferred, before step 0 completed
    assert lost._lost is not None and lost._lost.seen_at == 1  # seen at the end of the donating step
    with pytest.raises(DonatedValueError) as raised:
        lost.get()  # waits for step 0 (delivering it), then says the value is gone
    message = str(raised.value)
    assert "'state'" in message and "step 0" in message and "end of step 1" in message
    assert "copy=True" in message and "donate_argnums" in message
    assert raised.value.step == 0 and raised.value.name == "state"
    assert kept.get() == 2.0
    assert got and got[0][0] == 0 and "state" not in got[0][1] and got[0][1]["loss"] == 2.0


def test_delivery_raises_from_the_call_that_retires_the_step() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    dev.launch(1.0)
    state = _state()
    with thr.step():
        thr.defer(state, name="state")
        state = _donating(state)  # the step donates its own deferred value
    with pytest.raises(DonatedValueError, match=r"'state' deferred in step 0.*end of step 0"):
        thr.drain()
    assert "state" not in thr.latest
    with thr.step():  # the throttle goes on
        thr.defer(state, name="state")
    thr.drain()
    assert thr.latest["state"].tolist() == [1.0] * 4


def test_copy_true_survives_the_donation_and_copy_must_be_a_bool() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    dev.launch(1.0)
    state = _state()
    with thr.step():
        deferred = thr.defer(state, name="state", copy=True)
        state = _donating(state)
    thr.drain()
    assert deferred.get().tolist() == [0.0] * 4
    with thr.step(), pytest.raises(TypeError, match="copy must be True or False"):
        thr.defer(state, copy="yes")  # type: ignore[arg-type]


def test_on_the_real_jax_backend_a_donated_value_raises_and_a_loss_output_arrives() -> None:
    step = jax.jit(lambda s: (s + 1.0, jnp.sum(s)), donate_argnums=0)
    state = _state()
    thr = at.Throttle(2, device="jax")
    got: list[float] = []
    thr.on_complete(lambda n, values: got.append(float(values["loss"])))
    for _ in thr.wrap(range(4)):
        state, loss = step(state)  # the usual pattern: the state is donated, the loss output is not
        thr.defer(loss, name="loss")
    assert got == [0.0, 4.0, 8.0, 12.0]
    with pytest.raises(DonatedValueError, match="'state'"):
        for _ in thr.wrap(range(2)):
            thr.defer(state, name="state")
            state, loss = step(state)


def test_a_dict_of_metrics_every_step_arrives_and_a_donated_item_is_named() -> None:
    """The usual value, a dict of JAX metrics, deferred every step: held (no copy), read as numpy arrays that own their
    data; an item a later step donates before its step completed raises, naming the dict, while the step's other
    values arrive."""
    dev = FakeDevice()
    thr = dev.throttle(2)
    got: list[dict[str, Any]] = []
    thr.on_complete(lambda step, values: got.append(values["m"]))
    for i in range(4):
        with thr.step():
            thr.defer({"loss": jnp.float32(i) + 0.0, "mae": jnp.float32(2 * i) + 0.0}, name="m")
    thr.drain()
    assert [(float(m["loss"]), float(m["mae"])) for m in got] == [(float(i), 2.0 * i) for i in range(4)]
    assert all(type(v) is np.ndarray and v.flags.owndata for m in got for v in m.values())
    dev.launch(1.0)  # the next steps stay unfinished until the clock moves
    state = _state()
    with thr.step():
        lost = thr.defer({"loss": jnp.float32(9.0) + 0.0, "state": state}, name="m")
        kept = thr.defer(jnp.float32(7.0) + 0.0, name="loss")
    with thr.step():
        state = _donating(state)
    with pytest.raises(DonatedValueError) as raised:
        lost.get()
    assert raised.value.name == "m" and raised.value.step == 4 and kept.get() == 7.0


@pytest.mark.parametrize("reader", ["loop", "thread"])
def test_a_value_read_once_its_step_is_complete_but_not_retired_leaves_the_next_record_whole(reader: str) -> None:
    """``get()`` of a value whose step reports completion, before a throttle call retired it (the
    loop's thread, or a logging thread, as the docs allow): the next records and the delivery go
    on, and a later donation is still seen."""
    dev = FakeDevice()
    thr = dev.throttle(4)
    step = jax.jit(lambda s: (s + 1.0, jnp.sum(s)))
    state = _state()
    got: list[tuple[int, float]] = []
    thr.on_complete(lambda n, values: got.append((n, float(values["loss"]))))
    read: list[float] = []
    with thr.step():
        dev.launch(1.0)
        state, loss = step(state)
        first = thr.defer(loss, name="loss")
    with thr.step():  # handed out while step 0 runs
        dev.launch(1.0)
        state, loss = step(state)
        thr.defer(loss, name="loss")
        dev.host(1.5)  # step 0 is complete, and no throttle call has retired it yet
        assert first.ready()
        if reader == "loop":
            read.append(float(first))
        else:
            worker = threading.Thread(target=lambda: read.append(first.get().item()))
            worker.start()
            worker.join(timeout=30)
        assert read == [0.0]
    for _ in range(2):
        with thr.step():  # the records walk the values that hold arrays: step 0's is settled
            dev.launch(1.0)
            state, loss = step(state)
            thr.defer(loss, name="loss")
    thr.drain()
    assert got == [(0, 0.0), (1, 4.0), (2, 8.0), (3, 12.0)]
    assert float(first) == 0.0


class _Batch:
    """A batch whose death a test can see (a weak reference)."""


def _donating_loop(dev: FakeDevice, thr: at.Throttle, refs: list[weakref.ref[_Batch]],
                   kept: list[at.Deferred]) -> None:
    """A wrapped loop whose step 1 donates the array step 0 deferred, before step 0 completed."""
    state = _state()

    def batches() -> Any:
        for _ in range(6):
            batch = _Batch()
            refs.append(weakref.ref(batch))
            yield batch

    for i, _batch in enumerate(thr.wrap(batches())):
        dev.launch(1.0)
        if i == 0:
            kept.append(thr.defer(state, name="state"))
        else:
            state = _donating(state)


def test_a_donated_value_raised_at_delivery_ends_the_pass_and_frees_its_batches_without_the_gc() -> None:
    gc.collect()
    gc.disable()
    try:
        dev = FakeDevice()
        thr = dev.throttle(2)
        refs: list[weakref.ref[_Batch]] = []
        kept: list[at.Deferred] = []  # the user keeps the lost value's Deferred
        with pytest.raises(DonatedValueError):
            _donating_loop(dev, thr, refs, kept)
        assert refs and [ref() for ref in refs] == [None] * len(refs)  # no cycle keeps a batch or the pass
        thr.pause()  # the pass has ended: not "inside a wrapped loop"
        steps = thr.stats.steps
        with pytest.raises(DonatedValueError):
            kept[0].get()
        thr.drain()
        gc.collect()  # the collector finds no pass left to end
        assert (thr.stats.steps, thr.in_flight) == (steps, 0)
    finally:
        gc.enable()


def test_each_get_of_a_lost_value_raises_with_its_own_traceback_that_does_not_grow() -> None:
    dev = FakeDevice()
    thr = dev.throttle(4)
    dev.launch(1.0)
    state = _state()
    with thr.step():
        lost = thr.defer(state, name="state")
    with thr.step():
        state = _donating(state)
    with pytest.raises(DonatedValueError):
        thr.drain()
    depths = []
    errors = []
    for _ in range(3):
        with pytest.raises(DonatedValueError) as raised:
            lost.get()
        tb, depth = raised.value.__traceback__, 0
        while tb is not None:
            tb, depth = tb.tb_next, depth + 1
        depths.append(depth)
        errors.append(raised.value)
    assert depths[0] == depths[1] == depths[2]
    assert errors[0] is not errors[1]  # a new error each time: one kept by the caller keeps its own frames
    assert str(errors[0]) == str(errors[2]) and errors[2].seen_at == 1
