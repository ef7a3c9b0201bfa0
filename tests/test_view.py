"""The view as a drop-in for a DataLoader; deferred values as snapshots; backend details checked with fakes."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import FakeTorchEvent

import asyncthrottle as at
from asyncthrottle.backends import torch as devices

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


class _Numbers(torch.utils.data.IterableDataset):  # type: ignore[misc]
    def __iter__(self) -> Any:
        return iter(range(5))


def test_unsized_sources_work_with_a_progress_bar() -> None:
    loader = torch.utils.data.DataLoader(_Numbers(), batch_size=2)
    out = io.StringIO()
    view = at.throttle(loader, device="cpu", progress={"file": out, "mininterval": 0})
    assert [b.tolist() for b in view] == [[0, 1], [2, 3], [4]]
    assert "3it" in out.getvalue()  # no total


def test_the_view_forwards_the_loaders_attributes_and_names_itself_in_errors() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    view = at.throttle(loader, depth=2, device="cpu")
    assert view.dataset is dataset and view.batch_size == 4 and view.sampler is loader.sampler
    assert view.depth == 2 and view.stats.steps == 0 and callable(view.defer)
    with pytest.raises(AttributeError, match=r"Throttled view has no attribute 'datset'.*DataLoader"):
        _ = view.datset


class _Loader:
    def __init__(self) -> None:
        self.mixup_enabled = True

    def __iter__(self) -> Any:
        return iter(range(3))


def test_setting_an_attribute_on_the_view_sets_it_on_the_source() -> None:
    source = _Loader()
    view = at.throttle(source, depth=2, device="cpu")
    view.mixup_enabled = False
    assert source.mixup_enabled is False and view.mixup_enabled is False  # read back from the source
    view.epoch = 3
    assert source.epoch == 3  # type: ignore[attr-defined]
    del view.epoch
    assert not hasattr(source, "epoch")
    with pytest.raises(AttributeError, match=r"cannot set 'depth' on a throttled view.*view.throttle.depth"):
        view.depth = 3
    assert view.depth == 2 and not hasattr(source, "depth")
    assert list(view) == [0, 1, 2]


def test_turning_mixup_off_on_a_throttled_timm_prefetch_loader_turns_it_off() -> None:
    loader_mod = pytest.importorskip("timm.data.loader")
    mixup_mod = pytest.importorskip("timm.data.mixup")
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    base = torch.utils.data.DataLoader(dataset, batch_size=2)
    mixup = mixup_mod.FastCollateMixup(mixup_alpha=0.8, num_classes=2)
    base.collate_fn = mixup
    prefetcher = loader_mod.PrefetchLoader(base, device=torch.device("cpu"), re_prob=0.0)
    prefetcher.mixup_enabled = True  # as timm's create_loader leaves it when mixup is on
    view = at.throttle(prefetcher, depth=2, device="cpu")
    view.mixup_enabled = False  # timm's train_one_epoch at mixup_off_epoch
    assert mixup.mixup_enabled is False and prefetcher.mixup_enabled is False and view.mixup_enabled is False


def test_deferred_numpy_arrays_and_tensor_subclasses_are_snapshots() -> None:
    class Tagged(torch.Tensor):  # a subclass defined outside torch.*
        pass

    thr = at.Throttle(2, device="cpu")
    counter = np.zeros(1)
    tagged = torch.zeros(1).as_subclass(Tagged)
    seen: list[Any] = []
    for _ in thr.wrap(range(3)):
        counter += 1
        tagged += 1
        seen.append((thr.defer(counter), thr.defer(tagged)))
    assert [float(a.get()[0]) for a, _ in seen] == [1.0, 2.0, 3.0]
    assert [float(b.get()[0]) for _, b in seen] == [1.0, 2.0, 3.0]


class _FakeCudaTensor:
    """Stands in for a CUDA tensor: records how it was copied to the host."""

    def __init__(self, copies: list[dict[str, Any]], index: int = 0) -> None:
        self.device = SimpleNamespace(type="cuda", index=index)
        self.is_cpu, self.is_cuda = False, True
        self.copies = copies
        self.dtype, self.shape = torch.float32, ()

    def numel(self) -> int:
        return 1

    def element_size(self) -> int:
        return 4

    requires_grad = True  # detached before the copy
    layout, is_nested = torch.strided, False

    def detach(self) -> _FakeCudaTensor:
        return self

    def get_device(self) -> int:
        return int(self.device.index)

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def to(self, device: str, non_blocking: bool = False) -> str:
        self.copies.append({"device": device, "non_blocking": non_blocking})
        return "host copy"


class _Stream:
    def __init__(self, name: str) -> None:
        self.name, self.waited = name, []

    def wait_stream(self, other: Any) -> None:
        self.waited.append(other.name)


def test_device_tensors_copy_without_blocking_only_where_an_event_orders_the_copy(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[dict[str, Any]] = []
    # a first throttle imports torch's compiler (torch._dynamo), which needs the real torch.Tensor:
    # made before the patch, so the test passes run alone too
    at.Throttle(2, device="cpu")
    monkeypatch.setattr(torch, "Tensor", _FakeCudaTensor)  # isinstance checks see the fake as a tensor
    main, side = _Stream("main"), _Stream("side")
    current = [main]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    from asyncthrottle.backends import snapshots

    class Model:  # the ring's copy model: copies into a pinned slot on the current stream, known by its key
        def __init__(self, kind: str) -> None:
            self.kind = kind
            self.pin = lambda nbytes: torch.empty(nbytes, dtype=torch.uint8)
            self.event = lambda: None
            self.stream_key = lambda index: (current[-1].name, index, 1)
            self.stream = lambda key: {"main": main, "side": side}[key[0]]
            self.copy = lambda host, tensor: copies.append({"device": "cpu", "non_blocking": True})

    monkeypatch.setattr(snapshots, "TorchSnapshots", Model)
    thr = at.Throttle(2, device="cuda", sample_every=None)
    with thr.step():
        current.append(side)  # as under `with torch.cuda.stream(side):`
        thr.defer(_FakeCudaTensor(copies))
        current.pop()
    assert copies == [{"device": "cpu", "non_blocking": True}]
    assert main.waited == ["side"]  # the step's event, recorded on main, comes after the copy on side
    with thr.step():
        thr.defer(_FakeCudaTensor(copies))  # on the recording stream itself: nothing to join
    assert main.waited == ["side"] and len(copies) == 2
    sync_thr = at.Throttle(2, device="cpu")  # synchronous: no event would order the copy
    with sync_thr.step():
        sync_thr.defer(_FakeCudaTensor(copies))
    assert copies[-1] == {"device": "cpu", "non_blocking": False}


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"], ids=["current-device", "index-0", "index-1"])
def test_a_copy_on_another_devices_stream_is_joined_before_the_steps_event(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """A tensor on another GPU than the one the step's event records on (model parallel in one process): torch
    enqueues its copy on that GPU's current stream, which the event does not cover unless it joins it."""
    copies: list[dict[str, Any]] = []
    at.Throttle(2, device="cpu")  # torch's compiler imported before torch.Tensor is patched (see above)
    monkeypatch.setattr(torch, "Tensor", _FakeCudaTensor)
    streams = {f"main@{d}": _Stream(f"main@{d}") for d in (0, 1)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: streams[f"main@{index or 0}"])
    from asyncthrottle.backends import snapshots

    class Model:  # the ring's copy model: each device's current stream is main@<index>
        def __init__(self, kind: str) -> None:
            self.kind = kind
            self.pin = lambda nbytes: torch.empty(nbytes, dtype=torch.uint8)
            self.event = lambda: None
            self.stream_key = lambda index: (f"main@{index}", index, 1)
            self.stream = lambda key: streams[key[0]]
            self.copy = lambda host, tensor: copies.append({"device": "cpu", "non_blocking": True})

    monkeypatch.setattr(snapshots, "TorchSnapshots", Model)
    events_on = 1 if device == "cuda:1" else 0  # the current device is 0
    thr = at.Throttle(2, device=device, sample_every=None)
    for index in (0, 1):
        with thr.step():
            thr.defer(_FakeCudaTensor(copies, index=index))
    # the event's own stream needs no join; the other device's stream is joined into it, once
    assert streams[f"main@{events_on}"].waited == [f"main@{1 - events_on}"]
    assert streams[f"main@{1 - events_on}"].waited == []


def test_a_copy_on_a_side_stream_is_joined_before_the_steps_event(fake_cuda: SimpleNamespace) -> None:
    main, side = _Stream("main"), _Stream("side")
    event = devices.TorchEvent(FakeTorchEvent(), None, None, lambda: main)
    event.wait_stream(side)
    event.wait_stream(main)  # the same stream: nothing to join
    event.record()
    assert main.waited == ["side"]
    event.record()
    assert main.waited == ["side"]  # joined once, for the step that asked


def test_mps_events_get_no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded: list[tuple[Any, ...]] = []

    class MpsEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:  # torch.mps.event.Event.record() takes no stream
            recorded.append(())

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(torch.mps.event, "Event", MpsEvent)
    monkeypatch.setattr(devices, "_is_available", lambda torch, kind: kind == "mps")
    thr = at.Throttle(2, device="mps:0", sample_every=None)
    for _ in thr.wrap(range(2)):
        pass
    assert recorded == [(), ()]
    with pytest.raises(ValueError, match="MPS, which has one stream"):
        at.Throttle(2, device="mps:0", streams=[SimpleNamespace(wait_stream=lambda s: None, wait_event=lambda e: None)])


def test_a_disabled_bar_costs_what_no_bar_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncthrottle import _progress as progress

    calls = {"postfix": 0}
    original = progress.postfix
    monkeypatch.setattr(progress, "postfix", lambda thr: calls.update(postfix=calls["postfix"] + 1) or original(thr))
    view = at.throttle(range(100), device="cpu", progress={"disable": True})
    assert sum(view) == sum(range(100))
    assert calls["postfix"] == 0  # no stats snapshot per step (nor at the end)


@pytest.mark.cuda
@pytest.mark.parametrize("streams", [False, True], ids=["current-stream", "streams="])
def test_a_value_made_on_a_side_stream_arrives_complete_with_its_step(streams: bool) -> None:
    side = torch.cuda.Stream()
    options: dict[str, Any] = {"streams": [torch.cuda.current_stream(), side]} if streams else {"device": "cuda"}
    thr = at.Throttle(1, **options)
    got: list[float] = []
    thr.on_complete(lambda step, values: got.append(float(values["x"])))
    for i in thr.wrap(range(4)):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # milliseconds of work on the side stream before the value
            x = torch.full((), float(i) + 1.0, device="cuda")
            thr.defer(x, name="x")  # copied on side: the step's event must come after the copy
    assert got == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.cuda
def test_a_value_on_another_gpu_arrives_complete_with_its_step() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    thr = at.Throttle(1, device="cuda:0")
    got: list[float] = []
    thr.on_complete(lambda step, values: got.append(float(values["x"])))
    for i in thr.wrap(range(4)):
        with torch.cuda.device(1):
            torch.cuda._sleep(20_000_000)  # milliseconds of work on cuda:1's stream before the value
            x = torch.full((), float(i) + 1.0, device="cuda:1")
        thr.defer(x, name="x")  # copied on cuda:1's current stream: the step's event on cuda:0 must come after it
    assert got == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.cuda
def test_a_value_copied_on_a_stream_the_events_cannot_join_arrives_complete() -> None:
    """``events=torch.cuda.Event`` has no ``wait_stream``: a value made on a side stream gets an event of its own after
    its copy, which its delivery waits for (no stream synchronize); ``ready()`` says False until that copy is done."""
    side = torch.cuda.Stream()
    thr = at.Throttle(1, events=torch.cuda.Event)
    got: list[float] = []
    thr.on_complete(lambda step, values: got.append(float(values["x"])))
    for i in thr.wrap(range(4)):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # milliseconds of work on the side stream before the value
            x = torch.full((), float(i) + 1.0, device="cuda")
            deferred = thr.defer(x, name="x")
    assert got == [1.0, 2.0, 3.0, 4.0]
    assert deferred.ready() and float(deferred) == 4.0


class _Handouts:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self.steps.append(step)


@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_a_part_subscribed_mid_pass_hears_every_later_handout(device: str) -> None:
    from asyncthrottle.testing import FakeDevice

    thr = at.Throttle(2, device="cpu") if device == "cpu" else FakeDevice().throttle(2)
    heard, late = _Handouts(), _Handouts()
    for i in thr.wrap(range(5)):
        if i == 1:
            thr.subscribe(late)  # mid-pass: the next hand-outs must reach it
        if i == 3:
            thr.subscribe(heard)
            thr.unsubscribe(late)  # and one let go mid-pass hears no more
    assert late.steps == [2, 3] and heard.steps == [4]


def test_the_view_writes_no_field_of_the_core() -> None:
    """The rule has one road, the core's: the wrapped pass calls it and sets none of its counters."""
    import ast
    import inspect

    from asyncthrottle import view

    writes = []
    for node in ast.walk(ast.parse(inspect.getsource(view))):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and "core" in ast.unparse(target.value):
                writes.append(ast.unparse(target))
    assert writes == []



def test_to_copies_are_the_views_call_and_leave_the_core_lean() -> None:
    """The movers of to= are called by the view at each fetch and subscribe to nothing: a ring frees
    the slots of the steps retired when it takes one, so a to= loop keeps the lean road."""
    from helpers import inside

    from asyncthrottle.parts.prefetch import Prefetch, RingCopy
    from asyncthrottle.testing import FakeDevice

    thr = FakeDevice().throttle(2)
    core = inside(thr).core
    assert core.lean and inside(thr).part(Prefetch).movers == {}  # no wrap with to= yet
    RingCopy(core, SimpleNamespace())
    assert core.lean and not core.on_retire
