"""nonfinite=: a NaN or Inf in a deferred value is seen on the host copy as its step completes, with no sync."""

from __future__ import annotations

import dataclasses
import math
import pickle
import warnings
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.nonfinite import NonFiniteWatch
from asyncthrottle.testing import FakeDevice

NAN, INF = float("nan"), float("inf")
DEVICE_S, HOST_S = 0.010, 0.001  # the device is the bottleneck: the host runs `depth` steps ahead


def _run(thr: Any, dev: FakeDevice, values: list[Any], name: str = "loss") -> list[int]:
    """A throttled loop deferring ``values[i]`` at step i; returns the steps whose bodies ran."""
    ran: list[int] = []
    for i in thr.wrap(range(len(values))):
        ran.append(i)
        dev.host(HOST_S)
        dev.launch(DEVICE_S)
        thr.defer(values[i], name=name)
    return ran


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_raise_stops_within_depth_steps_with_the_exact_step_and_no_sync(depth: int) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth, nonfinite="raise")
    values = [1.0] * 20
    values[7] = NAN
    ran: list[int] = []
    with pytest.raises(at.NonFiniteError) as caught:
        for i in thr.wrap(range(len(values))):
            ran.append(i)
            dev.host(HOST_S)
            dev.launch(DEVICE_S)
            thr.defer(values[i], name="loss")
    err = caught.value
    assert err.step == 7 and err.name == "loss" and math.isnan(err.value)
    assert ran[-1] <= 7 + depth - 1  # the step that made it and at most depth - 1 after it: within depth + 1
    assert ran[-1] == 7 + depth - 1  # the host ran exactly as far ahead as the rule lets it
    assert err.seen - err.step == depth and f"{depth} step(s) later" in str(err)
    assert "'loss'" in str(err) and "step 7" in str(err) and "nan" in str(err)
    assert dev.syncs == 0
    assert thr.stats.nonfinite == 1 and thr.stats.nonfinite_first == 7


def test_on_a_synchronous_throttle_the_loop_stops_at_the_same_step() -> None:
    thr = at.Throttle(2, device="cpu", nonfinite="raise")
    ran: list[int] = []
    with pytest.raises(at.NonFiniteError) as caught:
        for i in thr.wrap(range(10)):
            ran.append(i)
            thr.defer(INF if i == 4 else float(i), name="loss")
    assert caught.value.step == 4 and ran == [0, 1, 2, 3, 4] and caught.value.value == INF


def test_the_core_stays_whole_after_the_error_every_part_and_callback_hears_the_step() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise", trace=100)
    seen: list[int] = []
    thr.on_complete(lambda step, values: seen.append(step))
    thr.begin_step()
    thr.defer(NAN, name="loss")
    dev.launch(DEVICE_S)
    thr.end_step()
    thr.begin_step()
    dev.launch(DEVICE_S)
    thr.defer(1.0, name="loss")
    thr.end_step()
    with pytest.raises(at.NonFiniteError) as caught:
        thr.begin_step()  # waits for step 0 (depth 2) and delivers it: raises from here
    assert caught.value.step == 0
    assert seen == [0] and math.isnan(thr.latest["loss"])  # the user's callback and latest heard it too
    core = inside(thr).core
    assert core.completed == 1 and core.steps == 2
    thr.drain()  # usable: the rest arrives
    assert seen == [0, 1] and thr.latest["loss"] == 1.0
    with thr.step():  # and the loop goes on
        dev.launch(DEVICE_S)
        thr.defer(2.0, name="loss")
    thr.drain()
    assert seen == [0, 1, 2] and thr.stats.completed == 3 and thr.stats.nonfinite == 1 and dev.syncs == 0


def test_warn_warns_once_with_the_step_name_value_and_lag_and_counts_every_step() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)  # nonfinite="warn" is the default
    values = [1.0, 2.0, NAN, 3.0, INF, -INF, 4.0]
    with pytest.warns(at.NonFiniteWarning) as record:
        ran = _run(thr, dev, values)
    assert ran == list(range(len(values)))  # warn never stops the loop
    messages = [str(w.message) for w in record if issubclass(w.category, at.NonFiniteWarning)]
    assert len(messages) == 1
    assert "'loss' of step 2 is nan" in messages[0] and "2 step(s) later" in messages[0]
    stats = thr.stats
    assert stats.nonfinite == 3 and stats.nonfinite_first == 2
    assert "nonfinite: 3 steps had a NaN or Inf deferred value, the first step 2" in thr.summary()
    assert issubclass(at.NonFiniteWarning, RuntimeWarning) and dev.syncs == 0


def test_a_clean_loop_says_nothing() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(thr, dev, [1.0, 2.0, 3.0, 1e308, -0.0])
    assert thr.stats.nonfinite == 0 and thr.stats.nonfinite_first is None and "nonfinite" not in thr.summary()


def test_none_looks_at_nothing() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(thr, dev, [NAN, INF])
    assert inside(thr).part(NonFiniteWatch) is None and thr.stats.nonfinite == 0


@dataclasses.dataclass
class Metrics:
    loss: float
    grad_norm: Any


def _first_bad(value: Any, depth: int = 1) -> at.NonFiniteError:
    dev = FakeDevice()
    thr = dev.throttle(depth, nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        _run(thr, dev, [0.0, value, 0.0], name="m")
    assert caught.value.step == 1
    return caught.value


def test_inf_and_nested_values_are_checked_and_the_place_is_named() -> None:
    torch = pytest.importorskip("torch")
    assert _first_bad({"a": 1.0, "b": [2.0, (3.0, INF)]}).name == "m['b'][1][1]"
    assert _first_bad(Metrics(1.0, {"w": torch.tensor([1.0, NAN, INF])})).name == "m.grad_norm['w']"
    err = _first_bad([torch.ones(3), torch.tensor([[1.0, -INF]])])
    assert err.name == "m[1]" and "shape (1, 2) with 1 NaN/Inf of 2 elements" in str(err)
    assert _first_bad(torch.tensor(NAN, dtype=torch.bfloat16)).name == "m"
    assert _first_bad(complex(1.0, INF)).name == "m"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "complex64"])
def test_a_tensor_of_several_elements_is_checked_in_every_dtype(dtype: str) -> None:
    """numpy reads most dtypes as a view; bfloat16 (which numpy lacks) and a conjugate view take
    torch's own check."""
    torch = pytest.importorskip("torch")
    kind = getattr(torch, dtype)
    for bad in (NAN, INF, -INF):
        value = torch.tensor([1.0, 2.0, 3.0]).to(kind)
        value[2] = bad
        assert _first_bad({"w": value}).name == "m['w']"
    clean = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(kind)
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    _run(thr, dev, [clean, clean.t(), clean[:, 1]])  # contiguous or not: a view either way
    assert thr.stats.nonfinite == 0
    if kind.is_complex:
        conjugate = torch.tensor([1 + 1j, complex(0.0, NAN)], dtype=kind).conj()
        assert conjugate.is_conj()  # numpy() refuses it
        assert _first_bad(conjugate).name == "m"


@pytest.mark.parametrize("shape", [(), (1,), (1, 2), (2, 3, 4), (2, 0, 3), (129,), (3, 50)])
def test_a_tensor_deferred_alone_is_checked_in_every_shape(shape: tuple[int, ...]) -> None:
    """A tensor deferred as the whole value skips the walk: small ones are read with one tolist() and
    flattened, large ones through numpy."""
    torch = pytest.importorskip("torch")
    clean = torch.ones(shape)
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    _run(thr, dev, [clean, clean.to(torch.bfloat16), clean.to(torch.int64), clean > 0], name="m")
    assert thr.stats.nonfinite == 0  # floats, bfloat16, integers and booleans that are finite
    if not clean.numel():
        return
    for bad in (NAN, INF, -INF):
        value = clean.clone()
        value.view(-1)[-1] = bad  # the last number: every row is looked at
        err = _first_bad(value)
        assert err.name == "m" and err.value is not None


def test_a_name_deferred_twice_in_a_step_is_checked_in_each_of_its_values() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        for i in thr.wrap(range(4)):
            dev.launch(DEVICE_S)
            thr.defer(1.0, name="loss")
            thr.defer(NAN if i == 1 else 1.0, name="loss")  # gradient accumulation: a list of two
    assert caught.value.step == 1 and caught.value.name == "loss[1]"


def test_integers_and_other_leaves_are_ignored() -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    values = [
        {"step": 3, "flag": True, "label": "nan", "none": None, "ids": torch.tensor([1, 2, 3])},
        [np.arange(4), np.int64(7), b"inf", torch.zeros(0)],
        object(),
    ]
    _run(thr, dev, values)
    assert thr.stats.nonfinite == 0


def test_numpy_values_are_checked() -> None:
    np = pytest.importorskip("numpy")
    assert _first_bad(np.array([1.0, np.nan], dtype=np.float32)).name == "m"
    assert "inf" in str(_first_bad({"x": np.float16(np.inf)}))
    assert _first_bad([np.ones(3), np.array(np.nan)]).name == "m[1]"


def test_one_element_arrays_of_any_dtype_after_a_float_one() -> None:
    """The watch reads a one-element float array without the walk once it saw one; other dtypes of
    the same type still take it."""
    np = pytest.importorskip("numpy")
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    values = [np.array(1.5, np.float32), np.array("nan"), np.array(None, dtype=object), np.array([True]),
              np.array(7), np.float64(2.0), np.array([3.0])]
    _run(thr, dev, values)
    assert thr.stats.nonfinite == 0
    for bad in (np.array(np.nan, np.float32), np.array([np.inf]), np.float32(-np.inf), np.array(complex(0, np.nan))):
        assert _first_bad([np.array(1.0), bad]).name == "m[1]"
        assert _first_bad(bad).name == "m"


def test_jax_values_are_checked_on_their_host_copies() -> None:
    jnp = pytest.importorskip("jax.numpy")
    err = _first_bad({"loss": jnp.array(jnp.nan)}, depth=2)
    assert err.name == "m['loss']" and math.isnan(float(err.value))
    assert "shape (3,) with 1 NaN/Inf of 3 elements" in str(_first_bad(jnp.array([1.0, jnp.inf, 2.0])))
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    _run(thr, dev, [jnp.arange(3), jnp.ones(2)])  # integers, and clean floats
    assert thr.stats.nonfinite == 0


def test_a_jax_throttle_raises_from_the_loop() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    thr = at.Throttle(2, device="jax", nonfinite="raise")
    ran: list[int] = []
    with pytest.raises(at.NonFiniteError) as caught:
        for i in thr.wrap(range(8)):
            ran.append(i)
            thr.defer(jnp.log(jnp.array(3.0 - i)), name="loss")  # log(0) = -inf at step 3
    assert caught.value.step == 3 and caught.value.value == -math.inf and ran[-1] <= 3 + 2 - 1


def test_the_options_errors() -> None:
    with pytest.raises(ValueError, match="nonfinite must be 'warn', 'raise' or None, got 'loud'"):
        at.Throttle(device="cpu", nonfinite="loud")
    with pytest.raises(ValueError, match="write it nonfinite='raise'"):
        at.Throttle(device="cpu", nonfinite="Raise ")
    with pytest.raises(TypeError, match=r"nonfinite must be .* got 1 \(int\)"):
        at.Throttle(device="cpu", nonfinite=1)
    with pytest.raises(TypeError, match="nonfinite"):
        at.Throttle(device="cpu", nonfinite=True)


def test_the_error_pickles_with_its_fields() -> None:
    err = pickle.loads(pickle.dumps(at.NonFiniteError(3, "loss", INF, 5)))
    assert (err.step, err.name, err.value, err.seen) == (3, "loss", INF, 5) and "2 step(s) later" in str(err)


def test_a_dict_of_jax_metrics_every_step_names_the_bad_item_after_clean_steps() -> None:
    """The usual JAX value, a dict of scalar metrics, is read item by item without its walk once the metrics' type is
    known: a NaN in one item, a later step's array of several elements and a bare float are still found and named."""
    jnp = pytest.importorskip("jax.numpy")
    metrics = [{"loss": jnp.float32(i), "mae": jnp.float32(2.0 * i)} for i in range(6)]
    metrics[3] = {"loss": jnp.float32(3.0), "mae": jnp.float32(NAN)}
    metrics[4] = {"loss": jnp.float32(4.0), "mae": jnp.array([1.0, INF])}
    metrics[5] = {"loss": jnp.float32(5.0), "mae": INF}
    dev = FakeDevice()
    thr = dev.throttle(2)
    with pytest.warns(at.NonFiniteWarning, match=r"value \"m\['mae'\]\" of step 3 is nan"):
        _run(thr, dev, metrics, name="m")
        thr.drain()
    assert thr.stats.nonfinite == 3 and thr.stats.nonfinite_first == 3
    thr = FakeDevice().throttle(2, nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        _run(thr, dev, [metrics[0], metrics[1], metrics[4]], name="m")
        thr.drain()
    assert caught.value.step == 2 and caught.value.name == "m['mae']"


def test_a_dict_of_torch_metrics_names_the_bad_item_after_clean_steps() -> None:
    torch = pytest.importorskip("torch")
    metrics = [{"loss": torch.tensor(float(i)), "acc": torch.tensor([0.5, 0.5])} for i in range(5)]
    metrics[3] = {"loss": torch.tensor(3.0), "acc": torch.tensor([0.5, NAN])}
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        _run(thr, dev, metrics, name="m")
        thr.drain()
    assert caught.value.step == 3 and caught.value.name == "m['acc']"


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_jax_low_precision_floats_are_checked(dtype: str) -> None:
    """bfloat16 and the float8 types reach the host as ml_dtypes arrays (``dtype.kind == 'V'`` for
    most): a NaN, an Inf where the type has one, alone, in a dict or in an array, is found."""
    jnp = pytest.importorskip("jax.numpy")
    kind = getattr(jnp, dtype)
    assert _first_bad(jnp.array(jnp.nan, kind), depth=2).name == "m"
    assert _first_bad(jnp.array([1.0, jnp.nan, 2.0], kind)).name == "m"
    bad = jnp.nan if dtype == "float8_e4m3fn" else jnp.inf  # e4m3fn has no Inf: NaN stands in
    err = _first_bad({"loss": jnp.array(1.0, kind), "norm": jnp.array(bad, kind)})
    assert err.name == "m['norm']" and ("inf" in str(err) or "nan" in str(err))
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    clean = {"loss": jnp.array(1.5, kind), "w": jnp.ones(3, kind), "i4": jnp.ones(2, jnp.int4)}
    _run(thr, dev, [clean, jnp.array(2.0, kind), jnp.ones(200, kind)], name="m")
    assert thr.stats.nonfinite == 0  # finite values, and an integer ml_dtypes type, say nothing


def test_a_jax_throttle_warns_at_a_bfloat16_nan_loss() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    thr = at.Throttle(2, device="jax")
    with pytest.warns(at.NonFiniteWarning, match="'loss' of step 3 is nan"):
        for i in thr.wrap(range(6)):
            thr.defer(jnp.log(jnp.array(3.0 - i, jnp.bfloat16)) * 0.0, name="loss")  # -inf * 0
    assert thr.stats.nonfinite == 3 and thr.stats.nonfinite_first == 3


def test_a_synchronous_nan_is_seen_in_its_own_step() -> None:
    """On the CPU a step's values arrive at its end: seen in that step, 0 steps later, never a step
    that has not started."""
    thr = at.Throttle(2, device="cpu", nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        for i in range(10):
            with thr.step():
                thr.defer(NAN if i == 3 else float(i), name="loss")
    err = caught.value
    assert (err.step, err.seen) == (3, 3) and thr.stats.steps == 4
    assert "seen on the host in the same step" in str(err) and "later" not in str(err)
    err = pickle.loads(pickle.dumps(err))
    assert (err.step, err.seen) == (3, 3) and "in the same step" in str(err)


def test_an_asynchronous_nan_says_how_many_steps_later_it_was_seen() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, nonfinite="raise")
    with pytest.raises(at.NonFiniteError) as caught:
        _run(thr, dev, [1.0, 1.0, 1.0, NAN, 1.0, 1.0, 1.0, 1.0])
    err = caught.value
    # raised as step 5 is handed out (depth 2): steps 4 was run after it, step 5 is starting
    assert (err.step, err.seen) == (3, 5) and thr.stats.steps == 5
    assert "seen on the host 2 step(s) later (once step 4 was recorded)" in str(err)


def _warn_in_a_loop(device: str) -> None:
    jnp = pytest.importorskip("jax.numpy") if device == "jax" else None
    thr = at.Throttle(2, device=device)
    for i in thr.wrap(range(4)):
        value = NAN if i >= 1 else 1.0
        thr.defer(value if jnp is None else jnp.array(value), name="loss")
    thr.drain()


@pytest.mark.parametrize("device", ["cpu", "jax"])
def test_each_throttle_warns_once_at_the_users_line(device: str) -> None:
    """Python shows a warning once per place: issued at the library's own line, a second throttle
    (a sweep, a notebook cell run again) showed nothing. It is the user's line, once a throttle."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own: once per place it is issued
        for _ in range(2):
            _warn_in_a_loop(device)
    shown = [w for w in caught if issubclass(w.category, at.NonFiniteWarning)]
    assert len(shown) == 2, [str(w.message) for w in shown]
    assert {w.filename for w in shown} == {__file__}
