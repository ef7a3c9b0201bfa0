"""``to=``: batches moved to the device one step ahead through a ring of pinned buffers (CPU fakes only)."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from helpers import inside  # noqa: E402

import asyncthrottle as at  # noqa: E402
from asyncthrottle._tree import map_leaves  # noqa: E402
from asyncthrottle.backends import copies  # noqa: E402
from asyncthrottle.parts import prefetch  # noqa: E402
from asyncthrottle.parts.prefetch import Prefetch  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402

Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Batch:
    image: Any
    label: Any
    name: str = "b"


class FakeCopy:
    """A copy model on the CPU: the "device" tensor is the staged host tensor itself.

    So a handed-out batch aliases its pinned slot, as the device's copy reads the
    slot until it is done: a slot written again too early changes a batch that
    is still in flight, which the tests see when its step retires.
    """

    def __init__(self) -> None:
        self.pins: list[int] = []
        self.events: list[SimpleNamespace] = []
        self.pinned: set[int] = set()  # ids of host tensors that count as pinned already
        self.copies: list[Any] = []
        self.joins: list[Any] = []
        self.pin_copies = 0
        self.active = False
        self.fail_next: BaseException | None = None

    def pin(self, nbytes: int) -> Any:
        self.pins.append(nbytes)
        return torch.zeros(nbytes, dtype=torch.uint8)

    def event(self) -> Any:
        self.events.append(SimpleNamespace(records=0))
        return self.events[-1]

    def is_pinned(self, tensor: Any) -> bool:
        return id(tensor) in self.pinned

    def pin_copy(self, tensor: Any) -> Any:
        self.pin_copies += 1
        return tensor.clone()

    @contextmanager
    def copying(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def copy(self, host: Any) -> Any:
        assert self.active, "copies run on the copy stream"
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        self.copies.append(host)
        return host

    def join(self, event: Any) -> None:
        assert self.active
        event.records += 1
        self.joins.append(event)


@pytest.fixture
def model(fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> FakeCopy:
    fake = FakeCopy()
    monkeypatch.setattr(copies, "CudaCopy", lambda device, streams=None: fake)
    return fake


def _ring(thr: at.Throttle) -> Any:
    """The staging ring of the throttle's one mover."""
    (mover,) = inside(thr).part(Prefetch).movers.values()
    return mover.ring


def batches(n: int, size: int = 256) -> list[Any]:
    return [(torch.full((size,), float(i)), torch.tensor([i])) for i in range(n)]


def _snapshot(batch: Any) -> Any:
    return map_leaves(batch, lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf)


class Checker:
    """A part that checks, as each step retires, that its batch still holds what the source gave."""

    def __init__(self) -> None:
        self.handed: dict[int, Any] = {}
        self.checked = 0

    def hand(self, step: int, batch: Any) -> None:
        self.handed[step] = (batch, int(batch[1]))  # the source's label is the value of every element

    def on_retire(self, step: int) -> None:
        (x, y), value = self.handed.pop(step)
        assert torch.equal(x, torch.full_like(x, float(value))), f"step {step}'s slot was written before it retired"
        assert int(y) == value
        self.checked += 1


def checked(depth: int | str | None) -> tuple[FakeDevice, at.Throttle, Checker]:
    """A fake device, a throttle on it (its loops to wrap with ``to="cuda"``), and a :class:`Checker` subscribed."""
    dev = FakeDevice()
    thr = dev.throttle(depth)
    checker = Checker()
    thr.subscribe(checker)
    return dev, thr, checker


def run(thr: at.Throttle, dev: FakeDevice, source: list[Any], checker: Checker, *, device_s: float = 0.010) -> None:
    for step, batch in enumerate(thr.wrap(source, to="cuda")):
        checker.hand(step, batch)
        dev.host(0.001)
        dev.launch(device_s)


def test_batches_come_out_in_order_with_their_structure(model: FakeCopy) -> None:
    dev = FakeDevice()
    t = [torch.arange(4.0) + i for i in range(8)]
    marker = object()
    source = [
        (t[0], t[1]),
        [t[2], "text", 3, None],
        {"a": t[3], "nested": {"b": [t[4]], "c": marker}},
        Pair(t[5], 7),
        Batch(t[6], t[7]),
    ]
    out = [_snapshot(batch) for batch in dev.throttle(2).wrap(source, to="cuda")]  # the slots are reused after
    assert torch.equal(out[0][0], t[0]) and torch.equal(out[0][1], t[1]) and type(out[0]) is tuple
    assert type(out[1]) is list and torch.equal(out[1][0], t[2]) and out[1][1:] == ["text", 3, None]
    assert torch.equal(out[2]["a"], t[3]) and torch.equal(out[2]["nested"]["b"][0], t[4])
    assert out[2]["nested"]["c"] is marker  # other values pass through unchanged
    assert type(out[3]) is Pair and torch.equal(out[3].x, t[5]) and out[3].y == 7
    assert type(out[4]) is Batch and torch.equal(out[4].image, t[6]) and torch.equal(out[4].label, t[7])
    assert out[4].name == "b"
    assert len(model.joins) == 5 and len(model.copies) == 8  # one event per batch, one copy per tensor


def test_a_ring_slot_is_written_again_only_after_its_step_retired(model: FakeCopy) -> None:
    dev, thr, checker = checked(2)
    run(thr, dev, batches(50), checker)
    assert checker.checked == 50
    assert len(model.pins) == 3  # depth + 1 slots: steps n-1 and n in flight while n+1 is staged
    assert thr.stats.pinned_bytes == 3 * (256 * 4 + 64)  # each tensor padded to 64 bytes


def test_pinned_memory_is_bounded_and_flat_over_1000_steps(model: FakeCopy) -> None:
    dev = FakeDevice()
    depth = 3
    thr = dev.throttle(depth)
    seen = []
    for _batch in thr.wrap(batches(1000, size=1024), to="cuda"):
        dev.launch(0.010)
        seen.append(thr.stats.pinned_bytes)
    one = 1024 * 4 + 8  # one batch's bytes
    assert max(seen) <= (depth + 2) * one
    assert set(seen[depth + 1:]) == {seen[-1]}  # flat once every slot was made
    assert len(model.pins) == depth + 1 and len(model.events) == depth + 1  # copy events pooled with slots


def test_slots_grow_only_when_a_batch_is_larger(model: FakeCopy) -> None:
    dev = FakeDevice()
    source = [(torch.zeros(n),) for n in (64, 64, 16, 256, 64, 64, 64, 64)]
    for _ in dev.throttle(1).wrap(source, to="cuda"):
        dev.launch(0.010)
    assert model.pins == [256, 256, 1024]  # two slots (depth + 1); the one the 1 KiB batch took was regrown


def test_pinned_host_tensors_are_copied_directly(model: FakeCopy) -> None:
    dev = FakeDevice()
    source = batches(3)
    for x, _ in source:
        model.pinned.add(id(x))
    out = list(dev.throttle(2).wrap(source, to="cuda"))
    assert [c is x for c, (x, _) in zip(model.copies[::2], source, strict=True)] == [True] * 3  # not staged
    assert model.pins == [64] * 2 and torch.equal(out[2][0], source[2][0])  # only the labels were staged


def _entering(calls: list[Any]) -> Callable[[Any], AbstractContextManager[None]]:
    """Stands in for ``torch.cuda.stream``: logs ("enter", the stream's name)."""

    @contextmanager
    def on(stream: Any) -> Iterator[None]:
        calls.append(("enter", stream.name))
        yield

    return on


def test_the_step_waits_on_its_batchs_copy_event_only(fake_cuda: SimpleNamespace, monkeypatch: Any) -> None:
    calls: list[Any] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_event(self, event: Any) -> None:
            calls.append(("wait_event", self.name, event))

        def wait_stream(self, other: Any) -> None:  # pragma: no cover - must never be called
            calls.append(("wait_stream", self.name, other))

    compute = Stream("compute")
    made: list[Stream] = []

    def new_stream(device: Any) -> Stream:
        made.append(Stream("copy"))
        return made[-1]

    on = _entering(calls)
    class Event:
        def record(self, stream: Any) -> None:
            calls.append(("record", stream.name, self))

    class DeviceTensor:
        def __init__(self, host: Any) -> None:
            self.host = host

        def record_stream(self, stream: Any) -> None:
            calls.append(("record_stream", stream.name))

    monkeypatch.setattr(torch.cuda, "Stream", new_stream)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    copy = copies.CudaCopy(torch.device("cuda", 0))
    monkeypatch.setattr(copy, "pin", lambda n: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(copy, "is_pinned", lambda t: False)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: DeviceTensor(self) if k["non_blocking"] else 1 / 0)
    monkeypatch.setattr(copies, "CudaCopy", lambda device, streams=None: copy)
    dev = FakeDevice()
    out = list(dev.throttle(2).wrap(batches(3), to="cuda"))
    assert len(made) == 1  # the copy stream is made once
    assert all(isinstance(leaf, DeviceTensor) for batch in out for leaf in batch)
    per_batch = [c[0] for c in calls[:6]]
    assert per_batch == ["enter", "record_stream", "record_stream", "record", "wait_event", "enter"]
    records = [c for c in calls if c[0] == "record"]
    waits = [c for c in calls if c[0] == "wait_event"]
    assert len(waits) == 3 and [w[2] for w in waits] == [r[2] for r in records]  # each on its batch's event
    assert all(r[1] == "copy" for r in records) and not [c for c in calls if c[0] == "wait_stream"]
    assert {c[1] for c in calls if c[0] == "record_stream"} == {"compute"}


def test_nothing_is_lost_on_break_or_an_exception(model: FakeCopy) -> None:
    dev, thr, checker = checked(2)
    view = thr.wrap(batches(20), to="cuda")
    for step, batch in enumerate(view):
        checker.hand(step, batch)
        dev.launch(0.010)
        if step == 4:
            break
    with pytest.raises(ZeroDivisionError):
        for step, batch in enumerate(view, start=5):
            checker.hand(step, batch)
            dev.launch(0.010)
            if step == 7:
                raise ZeroDivisionError
    thr.drain()
    assert thr.stats.steps == 8 and checker.checked == 8  # each exit recorded its step
    ring = _ring(thr)
    ring.retire(thr.stats.completed - 1)  # what the next batch's copy does first
    assert not ring.busy and len(ring.free) == len(model.pins) <= 4  # every slot free again, none leaked


def test_a_timeout_keeps_the_copied_batch_for_the_next_next(model: FakeCopy) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, timeout=0.005)
    it = iter(thr.wrap(batches(3), to="cuda"))
    first = next(it)
    dev.launch(0.010)
    with pytest.raises(at.ThrottleTimeout):
        next(it)
    copies = len(model.copies)
    second = next(it)  # waits again, hands out the batch it had fetched and copied
    assert len(model.copies) == copies and int(second[1]) == 1 and int(first[1]) == 0
    assert [int(b[1]) for b in it] == [2]


def test_an_interrupted_copy_is_made_again_by_the_next_next(model: FakeCopy) -> None:
    dev = FakeDevice()
    it = iter(dev.throttle(2).wrap(batches(3), to="cuda"))
    assert int(next(it)[1]) == 0
    model.fail_next = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    assert [int(b[1]) for b in it] == [1, 2]


def test_a_second_pass_reuses_the_slots(model: FakeCopy) -> None:
    dev, thr, checker = checked(2)
    view = thr.wrap(batches(10), to="cuda")
    for _ in range(2):
        for batch in view:
            checker.hand(thr.stats.steps, batch)
            dev.launch(0.010)
    assert checker.checked == 20 and len(model.pins) == 3


def test_depth_none_keeps_four_slots_and_stages_the_rest_through_torch(model: FakeCopy) -> None:
    dev, thr, checker = checked(None)
    run(thr, dev, batches(30), checker)
    assert len(model.pins) == prefetch.UNBOUNDED_SLOTS and model.pin_copies > 0
    assert checker.checked == 30


def test_depth_auto_lets_the_ring_follow_the_depth(model: FakeCopy) -> None:
    dev = FakeDevice()
    thr = dev.throttle("auto")
    inside(thr).core.set_depth(5)
    run(thr, dev, batches(30), Checker())
    assert len(model.pins) == 6 and model.pin_copies == 0


def test_with_streams_the_copy_is_ordered_before_every_stream_the_throttle_records_on(
    fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, str]] = []

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def wait_event(self, event: Any) -> None:
            log.append(("wait_event", self.name))

        def wait_stream(self, other: Any) -> None:
            log.append(("wait_stream", self.name))

    class DeviceTensor:
        def record_stream(self, stream: Stream) -> None:
            log.append(("record_stream", stream.name))

    current = [Stream("default")]

    @contextmanager
    def on(stream: Stream) -> Iterator[None]:
        current.append(stream)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("copy"))
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # copied directly: no staging ring
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: DeviceTensor())
    side, other = Stream("side"), Stream("other")
    thr = at.Throttle(2, device="cuda", streams=[side, other], sample_every=None, stall=None)
    for batch in thr.wrap([torch.zeros(2), torch.zeros(2)], to="cuda"):
        assert isinstance(batch, DeviceTensor)
        with on(side):  # the step runs on the streams the throttle records on
            pass
    waits = [name for what, name in log if what == "wait_event"]
    assert waits == ["side", "other"] * 2  # each batch's copy event, on every stream; never the default one
    assert [name for what, name in log if what == "record_stream"] == ["side", "other"] * 2


def test_to_cpu_hands_out_equal_batches() -> None:
    source = [(torch.arange(3.0) + i, {"y": Pair(torch.tensor(i), "k")}) for i in range(4)]
    out = list(at.throttle(source, depth=2, device="cpu", to="cpu"))
    for (x, rest), (x0, rest0) in zip(out, source, strict=True):
        assert torch.equal(x, x0) and torch.equal(rest["y"].x, rest0["y"].x) and rest["y"].y == "k"
    assert at.throttle(source, device="cpu", to=torch.device("cpu")).stats.pinned_bytes == 0


def test_stats_and_summary_report_the_pinned_bytes(model: FakeCopy) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1)
    for _ in thr.wrap(batches(4, size=2**18), to="cuda"):
        dev.launch(0.010)
    assert thr.stats.pinned_bytes == 2 * (2**20 + 64)
    assert thr.stats.as_dict()["pinned_bytes"] == thr.stats.pinned_bytes
    assert "2.0 MiB pinned by the staging ring" in thr.summary()


def test_closing_the_throttle_lets_go_of_the_rings_pinned_buffers(model: FakeCopy) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1)
    view = thr.wrap(batches(4, size=2**18), to="cuda")  # (a view kept after close keeps no pinned memory)
    for _ in view:
        dev.launch(0.010)
    ring = _ring(thr)
    assert ring.nbytes > 0 and ring.busy
    thr.close()
    assert ring.nbytes == 0 and not ring.free and not ring.busy and thr.stats.pinned_bytes == 0


def test_bad_to_says_what_to_pass_at_the_wrap(fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = at.Throttle(2, device="cpu")
    with pytest.raises(TypeError, match="to must be None, a str such as 'cuda'"):
        cpu.wrap([], to=3)
    with pytest.raises(ValueError, match="to='cdua' is not a device torch knows"):
        cpu.wrap([], to="cdua")
    with pytest.raises(ValueError, match=r"to='cuda' moves batches to cuda, but the throttle runs on cpu"):
        at.throttle([], device="cpu", to="cuda")
    with pytest.raises(ValueError, match=r"to='cuda:1' is cuda:1 but the throttle records on device='cuda'"):
        at.Throttle(2, device="cuda", sample_every=None).wrap([], to="cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    unavailable = r"to='cuda' was requested but cuda is not available here \(torch.cuda.is_available\(\) is False\)"
    with pytest.raises(RuntimeError, match=unavailable):
        FakeDevice().throttle(2).wrap([], to="cuda")


def test_to_a_device_type_with_no_backend_says_so_even_with_custom_events() -> None:
    for to in ("meta", "lazy"):
        with pytest.raises(RuntimeError, match=rf"to='{to}' was requested but {to} is not available here"):
            FakeDevice().throttle(2).wrap([], to=to)  # events=: any device type passes the same-device check


def test_wraps_of_one_throttle_to_one_device_share_one_ring(model: FakeCopy) -> None:
    """A loop that wraps its loader again each epoch pins no more: the mover is the throttle's, per device."""
    dev, thr, checker = checked(2)
    for _ in range(3):
        for batch in thr.wrap(batches(10), to="cuda"):
            checker.hand(thr.stats.steps, batch)
            dev.launch(0.010)
    assert checker.checked == 30 and len(model.pins) == 3 and thr.stats.pinned_bytes == 3 * (256 * 4 + 64)
    thr.unsubscribe(checker)
    assert len(list(thr.wrap(batches(2)))) == 2 and len(model.copies) == 60  # a wrap without to= copies nothing


def test_throttle_to_still_works_for_every_wrap_and_warns_at_the_users_line(model: FakeCopy) -> None:
    dev = FakeDevice()
    deprecated = r"Throttle\(to='cuda'\) is deprecated.*thr\.wrap\(loader, to='cuda'\)"
    with pytest.warns(DeprecationWarning, match=deprecated) as caught:
        thr = dev.throttle(2, to="cuda")
    assert caught[0].filename == __file__
    checker = Checker()
    thr.subscribe(checker)
    for view in (thr.wrap(batches(5)), thr.wrap(batches(5))):
        for batch in view:
            checker.hand(thr.stats.steps, batch)
            dev.launch(0.010)
    assert checker.checked == 10 and len(model.joins) == 10 and len(model.pins) == 3  # one ring for both
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="the throttle runs on cpu"):
        at.Throttle(2, device="cpu", to="cuda")  # still checked at construction
    with pytest.raises(TypeError, match="to must be None"):
        at.Throttle(2, device="cpu", to=3)


# -- on a real GPU (skipped elsewhere; the GPU script runs them) --------------------------------------


@pytest.mark.cuda
def test_on_a_gpu_batches_arrive_equal_with_no_sync_and_the_ring_stays_bounded() -> None:
    source = [(torch.full((1024, 1024), float(i)), torch.tensor([i])) for i in range(4)]  # 4 MiB each
    thr = at.Throttle(2, device="cuda", detect_sync="warn", sample_every=None)
    sums, pinned = [], []
    for x, y in thr.wrap(source * 50, to="cuda"):
        assert x.is_cuda and y.is_cuda
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]  # the device is behind the host
        sums.append(x.sum() + y.sum())
        pinned.append(thr.stats.pinned_bytes)
    got = torch.stack(sums).cpu()  # host-device sync: after the loop, to compare
    want = torch.tensor([float(i % 4) * 2**20 + i % 4 for i in range(200)])
    assert torch.equal(got, want)
    assert thr.sync_audit is not None and thr.sync_audit.syncs == 0
    assert max(pinned) <= 4 * (2**22 + 64) and len(set(pinned[10:])) == 1  # (depth + 2) x batch, flat


@pytest.mark.cuda
def test_on_a_gpu_with_streams_the_batches_a_side_stream_reads_are_the_sources() -> None:
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    source = [(torch.full((2**22,), float(i)), torch.tensor([i])) for i in range(4)]  # 16 MiB each: slow copies
    thr = at.Throttle(2, device="cuda", streams=[side], sample_every=None)
    sums = []
    for x, y in thr.wrap(source * 10, to="cuda"):
        with torch.cuda.stream(side):  # type: ignore[no-untyped-call]
            sums.append(x.sum() + y.sum())  # at once: only the copy's event keeps it from reading too early
    torch.cuda.current_stream().wait_stream(side)  # type: ignore[no-untyped-call]
    got = torch.stack(sums).cpu()  # host-device sync: after the loop, to compare
    want = torch.tensor([float(i % 4) * 2**22 + i % 4 for i in range(40)])
    assert torch.equal(got, want)


def test_a_mapping_that_is_not_a_dict_keeps_its_type_and_its_tensors_move() -> None:
    import collections


    class Encoding(collections.UserDict):  # the shape of transformers' BatchEncoding
        pass

    batch = Encoding({"input_ids": [1, 2], "mask": (3,)})
    moved = map_leaves(batch, lambda leaf: leaf * 10)
    assert type(moved) is Encoding and moved.data == {"input_ids": [10, 20], "mask": (30,)}
    counts = collections.defaultdict(int, {"a": 1})
    moved_counts = map_leaves(counts, lambda leaf: leaf + 1)
    assert moved_counts == {"a": 2} and moved_counts.default_factory is int  # a copy: it keeps its factory


@dataclasses.dataclass
class _Normalised:
    """A batch class that normalises its images when it is built."""

    images: Any
    scale: dataclasses.InitVar[float]  # no default: dataclasses.replace() cannot rebuild it
    normalisations: int = dataclasses.field(init=False, default=0)

    def __post_init__(self, scale: float) -> None:
        self.images = self.images / scale
        self.normalisations += 1


def test_to_does_not_build_a_dataclass_batch_again() -> None:
    batch = _Normalised(torch.tensor([255.0, 510.0]), scale=255.0)
    (out,) = list(at.throttle([batch], depth=2, device="cpu", to="cpu"))
    assert isinstance(out, _Normalised) and out.normalisations == 1 and out.images.tolist() == [1.0, 2.0]


def test_to_keeps_the_encodings_of_a_fast_tokenizers_batch_encoding() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[UNK]": 0, "[PAD]": 1, "hello": 2, "world": 3, "again": 4}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]")
    encoding = tokenizer(["hello world", "hello again world"], padding=True, return_tensors="pt")
    assert encoding.word_ids(1) == [0, 1, 2] and encoding.to("cpu").encodings is not None  # what .to() keeps
    (out,) = list(at.throttle([encoding], depth=2, device="cpu", to="cpu"))
    assert isinstance(out, transformers.BatchEncoding) and out.encodings is not None
    assert out.n_sequences == encoding.n_sequences and out.word_ids(0) == [0, 1, None] and out.word_ids(1) == [0, 1, 2]
    assert torch.equal(out["input_ids"], encoding["input_ids"])


def test_a_frameworks_callback_refuses_to_rather_than_ignore_it() -> None:
    from asyncthrottle.framework import ThrottleHooks

    with pytest.raises(TypeError, match="to='cuda' moves the batches of a wrapped loop"):
        ThrottleHooks(2, device="cpu", to="cuda")
