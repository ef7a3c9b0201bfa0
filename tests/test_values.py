"""Deferred values keep what the step had: containers are rebuilt without running their constructors."""

from __future__ import annotations

import collections
import dataclasses

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
