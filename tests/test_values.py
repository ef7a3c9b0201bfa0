"""Deferred values keep what the step had: containers are rebuilt without running their constructors."""

from __future__ import annotations

import collections
import dataclasses
import random
import sys
import warnings
from typing import Any

import pytest

import asyncthrottle as at

torch = pytest.importorskip("torch")


@dataclasses.dataclass
class Normalised:
    """A batch class that normalises its images when it is built."""

    images: torch.Tensor
    normalisations: int = 0

    def __post_init__(self) -> None:
        self.images = self.images / 2
        self.normalisations += 1


@dataclasses.dataclass(frozen=True)
class Scaled:
    images: torch.Tensor
    scale: dataclasses.InitVar[float]  # no default: dataclasses.replace() cannot rebuild it
    seen: int = dataclasses.field(init=False, default=0)

    def __post_init__(self, scale: float) -> None:
        object.__setattr__(self, "images", self.images * scale)
        object.__setattr__(self, "seen", self.seen + 1)


def _defer_once(value: object) -> tuple[at.Deferred, at.Throttle]:
    thr = at.Throttle(2, device="cpu")
    for _ in thr.wrap(range(1)):
        deferred = thr.defer(value, name="batch")
    return deferred, thr


def test_a_deferred_dataclass_is_not_built_again() -> None:
    deferred, thr = _defer_once(Normalised(torch.full((2,), 8.0)))
    for got in (deferred.get(), deferred.get(), thr.latest["batch"]):
        assert isinstance(got, Normalised)
        assert (got.normalisations, got.images.tolist()) == (1, [4.0, 4.0])


def test_a_deferred_frozen_dataclass_with_an_initvar_keeps_its_fields() -> None:
    batch = Scaled(torch.ones(2), scale=3.0)
    deferred, _ = _defer_once(batch)
    got = deferred.get()
    assert isinstance(got, Scaled) and (got.images.tolist(), got.seen) == ([3.0, 3.0], 1)
    assert got.images is not batch.images  # still a snapshot


def test_a_deferred_dict_subclass_keeps_its_attributes_and_factory() -> None:
    class Tagged(dict):  # type: ignore[type-arg]
        pass

    tagged = Tagged(x=torch.ones(1))
    tagged.source = "train"  # type: ignore[attr-defined]
    counts = collections.defaultdict(list, {"x": torch.ones(1)})
    thr = at.Throttle(2, device="cpu")
    for _ in thr.wrap(range(1)):
        first, second = thr.defer(tagged), thr.defer(counts)
    got = first.get()
    assert type(got) is Tagged and got.source == "train" and got["x"].tolist() == [1.0]
    assert got["x"] is not tagged["x"]
    got_counts = second.get()
    assert type(got_counts) is collections.defaultdict and got_counts.default_factory is list


THR: at.Throttle | None = None  # a training script's module-level throttle: Dynamo guards on G['THR'] ...


def _compiled_step(x: torch.Tensor) -> torch.Tensor:
    loss = (x * 2).sum()
    assert THR is not None
    THR.defer(loss, name="loss")
    _ = THR.latest  # reading the throttle inside the step is no guard either
    return loss + 1


def test_defer_in_a_compiled_step_compiles_a_fixed_number_of_graphs() -> None:
    global THR
    from asyncthrottle.testing import FakeDevice

    graphs: list[object] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward  # the captured graph as it is: no inductor, no C++ compiler

    torch._dynamo.reset()
    dev = FakeDevice()
    THR = dev.throttle(2)
    try:
        step = torch.compile(_compiled_step, backend=counting)
        for _ in THR.wrap(range(16)):
            assert step(torch.ones(4)).item() == 9.0
            dev.launch(0.001)
        assert THR.latest["loss"].item() == 8.0 and THR.stats.steps == 16
        assert len(graphs) <= 2  # the graphs before and after the eager call; none per step
    finally:
        THR = None
        torch._dynamo.reset()


@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_one_named_tensor_takes_the_short_path_and_arrives_as_the_walked_one(device: str) -> None:
    """``defer(tensor, name=...)``, a step's first value, skips the walk (a plain torch.Tensor
    only): a detached snapshot of the value it had, like the same tensor deferred inside a dict."""
    from asyncthrottle.testing import FakeDevice

    dev = FakeDevice()
    thr = at.Throttle(2, device="cpu") if device == "cpu" else dev.throttle(2)
    got: list[dict[str, object]] = []
    thr.on_complete(lambda step, values: got.append(values))
    weight = torch.ones(3, requires_grad=True)
    parameter = torch.nn.Parameter(torch.ones(2))  # a subclass: the walk, as before
    for i in thr.wrap(range(3)):
        value = weight * (i + 1)
        short = thr.defer(value, name="short")
        thr.defer({"walked": value}, name="dict")
        thr.defer(parameter, name="param")
        with torch.no_grad():
            value.add_(100.0)  # after the snapshot: not seen
            parameter.add_(1.0)
        dev.launch(1e-3)
    thr.drain()
    assert [v["short"].tolist() for v in got] == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
    assert all(torch.equal(v["short"], v["dict"]["walked"]) for v in got)  # type: ignore[index]
    assert not any(v["short"].requires_grad or v["param"].requires_grad  # type: ignore[union-attr]
                   or v["dict"]["walked"].requires_grad for v in got)  # type: ignore[index]
    assert [v["param"].tolist() for v in got] == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]  # type: ignore[union-attr]
    assert short.get().tolist() == [3.0] * 3


def test_a_donated_value_error_pickles_and_copies_with_its_message_and_attributes() -> None:
    """A worker's error crosses a process pool (pickle) and copy.copy keeps it whole."""
    import copy
    import pickle

    from asyncthrottle.values import DonatedValueError

    for seen_at in (3, None):
        error = DonatedValueError(2, "state", seen_at)
        for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
            assert type(again) is DonatedValueError and str(again) == str(error)
            assert (again.step, again.name, again.seen_at) == (2, "state", seen_at)


# -- the short paths against the walk -------------------------------------------------------------

Pair = collections.namedtuple("Pair", ["first", "second"])
_FILLS = (0.5, 2.0, -1.0, float("nan"), float("inf"))


def _spec(rng: random.Random, depth: int = 0) -> tuple[Any, ...]:
    """A random value to defer, as a description both runs build alike: a leaf (a JAX array, a torch tensor, a
    numpy array, a Python scalar, None, a str) or, above the top, a container of them."""
    kind = rng.choice(["jax", "jax", "torch", "torch", "np", "float", "int", "none", "str"]
                      + (["dict", "dict", "list", "tuple", "pair"] if depth < 2 else []))
    if kind in ("jax", "torch", "np"):
        return (kind, rng.choice([(), (1,), (3,)]), rng.choice(_FILLS), rng.random() < 0.3)
    if kind == "float":
        return (kind, rng.choice(_FILLS))
    if kind in ("int", "none", "str"):
        return (kind,)
    items = [_spec(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "pair":
        return (kind, _spec(rng, depth + 1), _spec(rng, depth + 1))
    return (kind, items)


def _build(spec: tuple[Any, ...], jnp: Any, np: Any, mutable: list[Any]) -> Any:
    """The value of ``spec``; its torch tensors (without grad) and numpy arrays go to ``mutable``, updated in place
    after the defer (a snapshot must not see it)."""
    kind = spec[0]
    if kind == "jax":
        return jnp.full(spec[1], spec[2], jnp.float32) + 0.0  # a fresh buffer (it may be donated)
    if kind == "torch":
        tensor = torch.full(spec[1], spec[2], requires_grad=spec[3])
        if spec[3]:
            return tensor * 1.0
        mutable.append(tensor)
        return tensor
    if kind == "np":
        array = np.full(spec[1], spec[2], np.float32)
        mutable.append(array)
        return array
    if kind == "dict":
        return {f"k{i}": _build(item, jnp, np, mutable) for i, item in enumerate(spec[1])}
    if kind in ("list", "tuple"):
        built = [_build(item, jnp, np, mutable) for item in spec[1]]
        return built if kind == "list" else tuple(built)
    if kind == "pair":
        return Pair(_build(spec[1], jnp, np, mutable), _build(spec[2], jnp, np, mutable))
    return {"float": lambda: spec[1], "int": lambda: 7, "none": lambda: None, "str": lambda: "s"}[kind]()


def _canon(value: Any) -> Any:
    """What a delivered value is, comparably (NaN as its repr): types, structure, dtypes, shapes and numbers."""
    np = sys.modules["numpy"]
    if isinstance(value, dict):
        return ("dict", type(value).__name__, [(key, _canon(item)) for key, item in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_canon(item) for item in value])
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), repr(value.tolist()), value.requires_grad)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, repr(value.tolist()))
    return (type(value).__name__, repr(value))


def _script(rng: random.Random) -> list[list[tuple[Any, ...]]]:
    """Steps, each a list of calls: ``("defer", spec, name, copy)`` or ``("donate", k)`` (the step's k-th defer's
    JAX array donated to a jitted call before the step completes)."""
    # the first defer subscribes (the walk); then one of each short path at least
    steps: list[list[tuple[Any, ...]]] = [[("defer", (kind, (), 1.0, False), "loss", False)]
                                          for kind in ("jax", "jax", "torch")]
    for _ in range(rng.randint(4, 10)):
        calls: list[tuple[Any, ...]] = []
        for k in range(rng.choice([0, 1, 1, 1, 2, 3])):
            # mostly the usual first call: one named array or tensor
            spec = _spec(rng) if rng.random() < 0.5 else (rng.choice(["jax", "torch"]), (), rng.choice(_FILLS), False)
            name = rng.choice(["loss", "loss", "m", None, None, "value"] + (["a"] * 3 if k else []) + [1] * (k == 0))
            copy = rng.choice([False] * 8 + [True, "yes"])
            calls.append(("defer", spec, name, copy))
            if spec[0] == "jax" and rng.random() < 0.2:
                calls.append(("donate", len(calls) - 1))
        steps.append(calls)
    return steps


def _run(script: list[list[tuple[Any, ...]]], device: str, first: bool) -> tuple[list[Any], int]:
    """Everything the script's loop sees (each call's result or error, each step's delivered values, the non-finite
    warnings and counts, ``latest``, and each value's ``get()``), and how many step bodies ran. ``first``: defer a
    value of no interest first in every step, so that every value of the script takes the walk."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from asyncthrottle.testing import FakeDevice

    donate = jax.jit(lambda array: array + 1.0, donate_argnums=0)
    dev = FakeDevice()
    thr = at.Throttle(2, device="cpu") if device == "cpu" else dev.throttle(2)
    seen: list[Any] = []
    thr.on_complete(lambda step, values: seen.append(
        ("delivered", step, _canon({k: v for k, v in values.items() if k != "_first"}))))
    made: list[Any] = []
    bodies = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for calls in script:
            try:
                with thr.step():
                    bodies += 1
                    if first:
                        thr.defer(0, name="_first")
                    arrays: list[Any] = []
                    for call in calls:
                        if call[0] == "donate":
                            if arrays[call[1]] is not None:
                                donate(arrays[call[1]])
                            continue
                        mutable: list[Any] = []
                        value = _build(call[1], jnp, np, mutable)
                        arrays.append(value if call[1][0] == "jax" else None)
                        try:
                            made.append(thr.defer(value, name=call[2], copy=call[3]))
                            seen.append(("deferred", made[-1].name, made[-1].unnamed))
                        except (TypeError, ValueError) as error:
                            seen.append(("refused", type(error).__name__, str(error)))
                        for item in mutable:
                            item += 1000
                    dev.launch(1e-3)
            except Exception as error:  # a delivery's error, raised by the hand-out or the step's end
                seen.append(("raised", type(error).__name__, str(error)))
        try:
            thr.drain()
        except Exception as error:
            seen.append(("raised", type(error).__name__, str(error)))
    seen.append(("warned", [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]))
    stats = thr.stats
    seen.append(("stats", stats.nonfinite, stats.nonfinite_first))
    seen.append(("latest", _canon({k: v for k, v in thr.latest.items() if k != "_first"})))
    for deferred in made:
        try:
            seen.append(("got", _canon(deferred.get())))
        except Exception as error:
            seen.append(("get raised", type(error).__name__, str(error)))
    return seen, bodies


@pytest.mark.parametrize("seed", range(16))
def test_the_short_paths_deliver_what_the_walk_delivers(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``defer()`` of a step's first value, one JAX array or torch tensor, skips the walk; a JAX array of a type seen
    before skips the leaf copier's calls, and its delivery the walk back. Random trees (JAX arrays, torch tensors,
    numpy arrays, dicts of metrics, nested lists, tuples and namedtuples, scalars, None; NaN and Inf among them;
    donations, bad names and bad ``copy=``) go through both roads: the same values, the same non-finite reports, the
    same errors."""
    pytest.importorskip("jax")
    from asyncthrottle import values
    from asyncthrottle.backends import snapshots

    rng = random.Random(seed)
    script, device = _script(rng), rng.choice(["fake", "cpu"])
    walks = [0]

    class Counting(snapshots.Snapshot):
        __slots__ = ()

        def __init__(self, *args: Any) -> None:
            walks[0] += 1
            super().__init__(*args)

    monkeypatch.setattr(values, "Snapshot", Counting)
    short, _ = _run(script, device, first=False)
    short_walks, walks[0] = walks[0], 0
    # the walk alone: no type of JAX array kept (the leaf copier's and the delivery's short cuts never apply), and
    # never the step's first value
    kept = dict(snapshots.JAX_ARRAYS)
    monkeypatch.setattr(snapshots, "_JAX_KEPT", 0)
    snapshots.JAX_ARRAYS.clear()
    try:
        walked, bodies = _run(script, device, first=True)
    finally:
        snapshots.JAX_ARRAYS.update(kept)
    assert short == walked
    deferred = sum(1 for entry in short if entry[0] == "deferred")
    assert walks[0] == deferred + bodies  # every value walked, and each step's first
    assert short_walks <= deferred - 2  # the short paths were taken


def test_a_subscriber_hears_each_steps_values_before_the_callbacks() -> None:
    """``Subscriber.on_values``: the values' delivery tells the core's list (the non-finite watch is one
    of them), then the ``on_complete`` callbacks; a subscriber that comes and goes is told from then on."""
    thr = at.Throttle(2, device="cpu")
    told: list[tuple[str, int, dict[str, Any]]] = []

    class Values(at.Subscriber):
        def on_values(self, step: int, values: dict[str, Any]) -> None:
            told.append(("part", step, values))

    thr.on_complete(lambda step, values: told.append(("callback", step, values)))
    part = Values()
    for i in thr.wrap(range(3)):
        if i == 1:
            thr.subscribe(part)
        thr.defer(float(i), name="loss")
    thr.unsubscribe(part)
    for _ in thr.wrap(range(1)):
        thr.defer(7.0, name="loss")
    assert told == [("callback", 0, {"loss": 0.0}), ("part", 1, {"loss": 1.0}), ("callback", 1, {"loss": 1.0}),
                    ("part", 2, {"loss": 2.0}), ("callback", 2, {"loss": 2.0}), ("callback", 3, {"loss": 7.0})]


def test_a_values_subscriber_that_raises_hides_them_from_no_other_part_or_callback() -> None:
    thr = at.Throttle(2, device="cpu", nonfinite="warn")
    told: list[str] = []

    class Raising:
        def on_values(self, step: int, values: dict[str, Any]) -> None:
            told.append("raising")
            raise ValueError("a user's values hook")

    class Listening:
        def on_values(self, step: int, values: dict[str, Any]) -> None:
            told.append("listening")

    thr.subscribe(Raising())
    thr.subscribe(Listening())
    thr.on_complete(lambda step, values: told.append("callback"))
    with pytest.warns(at.NonFiniteWarning), pytest.raises(ValueError, match="a user's values hook"):
        with thr.step():
            thr.defer(float("nan"), name="loss")
    # the watch (a part subscribed before it) and the callback heard the step all the same
    assert told == ["raising", "listening", "callback"] and thr.stats.nonfinite == 1
