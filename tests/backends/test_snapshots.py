"""Deferred CUDA (and XPU) tensors, with counting fakes: a ring of reused pinned buffers, no Python stream per tensor.

The tensors are fakes that say they live on CUDA (or XPU); the copy model
(``asyncthrottle.backends.snapshots.TorchSnapshots``) is a fake that counts pinned
allocations, stream objects and copies; the steps' events are a FakeDevice's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from helpers import inside

torch = pytest.importorskip("torch")

import asyncthrottle as at  # noqa: E402
from asyncthrottle.backends import snapshots  # noqa: E402
from asyncthrottle.backends.torch import TorchEvent  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402

_RealTensor = torch.Tensor


class _FakeCudaTensor:
    """A tensor that says it is on cuda:0; its data is a real CPU tensor."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.device = SimpleNamespace(type="cuda", index=0)
        self.is_cpu, self.is_cuda = False, True
        self.dtype, self.shape = data.dtype, data.shape
        self.fallback_copies = 0

    requires_grad = True  # detached before the copy
    layout, is_nested = torch.strided, False

    def detach(self) -> _FakeCudaTensor:
        return self

    def get_device(self) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def numel(self) -> int:
        return int(self.data.numel())

    def element_size(self) -> int:
        return int(self.data.element_size())

    def to(self, device: str, non_blocking: bool = False) -> Any:  # torch's own pinned pool: every slot busy
        self.fallback_copies += 1
        return self.data.clone()


class _FakeXpuTensor(_FakeCudaTensor):
    """A tensor that says it is on xpu:0 (``is_cuda`` False, ``is_xpu`` True)."""

    def __init__(self, data: Any) -> None:
        super().__init__(data)
        self.device = SimpleNamespace(type="xpu", index=0)
        self.is_cuda, self.is_xpu = False, True


class _AnyTensor(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_RealTensor, _FakeCudaTensor))


class _Tensor(metaclass=_AnyTensor):
    """``torch.Tensor`` for the test: real tensors and the fakes are both tensors."""


class _Marker:
    """An event the counting model recorded on a stream after its copies."""

    def __init__(self, model: _CountingSnapshots) -> None:
        self.model, self.key = model, None

    def query(self) -> bool:
        return self.model.copies_done

    def synchronize(self) -> None:
        self.model.waited.append(self.key)


class _CountingSnapshots:
    """The copy model, counting: pinned buffers made, Stream objects made, copies (into which buffer)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # the device type of the tensors it copies: "cuda" or "xpu"
        self.pins: list[int] = []
        self.streams_made = 0
        self.key_calls = 0
        self.current = (1, 0, 1)  # (stream_id, device_index, device_type) of the current stream
        self.copies: list[int] = []  # the buffer (data_ptr) each copy wrote
        self.synchronized: list[Any] = []  # the streams waited for on the host, in order
        self.marked: list[Any] = []  # the streams an event was recorded on after their copies, in order
        self.waited: list[Any] = []  # the streams whose such event the host waited for, in order
        self.markers_made = 0
        self.copies_done = True  # what a marker's query() answers
        self._free: list[_Marker] = []
        self.bare = True  # the steps' events, with no wait_stream, record on the current stream (as torch.cuda.Event)
        _CountingSnapshots.last = self

    last: _CountingSnapshots

    def pin(self, nbytes: int) -> Any:
        self.pins.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    def event(self) -> None:
        return None

    def stream_key(self, index: int) -> Any:
        self.key_calls += 1
        return self.current

    def current_device(self) -> int:
        return 0

    def bare_event(self, event: Any) -> bool:
        return self.bare

    def stream(self, key: Any) -> Any:
        self.streams_made += 1
        return SimpleNamespace(key=key, synchronize=lambda: self.synchronized.append(key))

    def marker(self, key: Any) -> _Marker:
        if self._free:
            marker = self._free.pop()
        else:
            marker = _Marker(self)
            self.markers_made += 1
        marker.key = key
        self.marked.append(key)
        return marker

    def release(self, markers: list[_Marker]) -> None:
        self._free.extend(markers)

    def copy(self, host: Any, tensor: Any) -> None:
        self.copies.append(host.data_ptr())
        host.copy_(tensor.data)


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> type[_CountingSnapshots]:
    warm = FakeDevice().throttle(2, sample_every=None)  # what a first throttle imports, before torch.Tensor is patched
    with warm.step():
        warm.defer(torch.zeros(1))
    warm.drain()
    monkeypatch.setattr(torch, "Tensor", _Tensor)
    monkeypatch.setattr(snapshots, "TorchSnapshots", _CountingSnapshots)
    return _CountingSnapshots


def _run(steps: int, depth: int, sizes: list[int] | None = None,
         tensor_type: type[_FakeCudaTensor] = _FakeCudaTensor) -> tuple[Any, list[Any], dict[int, Any]]:
    """A loop deferring one CUDA (``tensor_type``'s) tensor a step on a FakeDevice; returns the throttle, the tensors
    and what arrived."""
    dev = FakeDevice()
    thr = dev.throttle(depth, sample_every=None)
    arrived: dict[int, Any] = {}
    retired: list[int] = []
    writes: list[tuple[int, int]] = []  # (step, buffer) of each ring copy
    thr.on_complete(lambda step, values: (arrived.__setitem__(step, values["x"].clone()), retired.append(step)))
    tensors = []
    for i in thr.wrap(range(steps)):
        n = sizes[i] if sizes else 4
        tensor = tensor_type(torch.arange(n, dtype=torch.float32) + 100 * i)
        tensors.append(tensor)
        before = len(_CountingSnapshots.last.copies) if hasattr(_CountingSnapshots, "last") else 0
        thr.defer(tensor, name="x")
        model = _CountingSnapshots.last
        if len(model.copies) > before:
            buffer = model.copies[-1]
            used = [s for s, b in writes if b == buffer]
            assert not used or used[-1] in retired, f"step {i} reuses the buffer of step {used[-1]}, not retired"
            writes.append((i, buffer))
        dev.launch(1e-3)  # each step's work keeps it unfinished for a millisecond of fake time
    thr.drain()
    return thr, tensors, arrived


@pytest.mark.parametrize("tensor_type", [_FakeCudaTensor, _FakeXpuTensor], ids=["cuda-tensors", "xpu-tensors"])
def test_steady_state_makes_no_pinned_allocation_and_no_stream_object(
    model: type[_CountingSnapshots], tensor_type: type[_FakeCudaTensor]
) -> None:
    _, tensors, arrived = _run(steps=50, depth=2, tensor_type=tensor_type)
    counting = model.last
    assert counting.kind == tensor_type(torch.zeros(1)).device.type  # XPU tensors take the same ring
    assert len(counting.pins) <= 2 + 2  # depth + 2 slots, each pinned once: none in steady state
    assert counting.streams_made == 0  # the copies ran on the event's stream: joined without a Stream object
    assert len(counting.copies) == 50 and all(t.fallback_copies == 0 for t in tensors)  # one ring copy each
    assert sorted(arrived) == list(range(50))
    for i, value in arrived.items():
        assert value.tolist() == [100.0 * i + k for k in range(4)]  # copied out of the ring before its reuse


def test_a_value_larger_than_its_slot_arrives_whole(model: type[_CountingSnapshots]) -> None:
    sizes = [4] * 10 + [1000] + [4] * 10
    _, _, arrived = _run(steps=len(sizes), depth=2, sizes=sizes)
    assert arrived[10].tolist() == [1000.0 + k for k in range(1000)]
    assert all(arrived[i].tolist() == [100.0 * i + k for k in range(4)] for i in arrived if i != 10)
    assert max(model.last.pins) >= 4000  # the slot grew to the largest value


def test_a_slot_reuses_its_views_and_a_new_shape_or_a_grown_slot_gets_its_own(
    model: type[_CountingSnapshots],
) -> None:
    """The ring's typed views of a slot are made once per kind of tensor (three torch calls a
    tensor, 6.6 us on the host, in every step before); a shape the slot has not held, or a slot that
    grew, gets a view of its own, and every value arrives as it was."""
    sizes = [4, 2] * 10 + [1000] + [4, 2] * 5
    thr, _, arrived = _run(steps=len(sizes), depth=2, sizes=sizes)
    for i, n in enumerate(sizes):
        assert arrived[i].tolist() == [100.0 * i + k for k in range(n)]
    ring = inside(thr).copies.ring
    slots = [*ring.free, *ring.busy]
    assert len(slots) <= 4 and all(1 <= len(slot.views) <= 2 for slot in slots)
    for slot in slots:  # every view is of the slot's current buffer (grown ones let the old go)
        assert all(view.untyped_storage().data_ptr() == slot.buffer.untyped_storage().data_ptr()
                   for view in slot.views.values())


def test_a_copy_on_a_side_stream_joins_the_steps_event_once_per_stream(model: type[_CountingSnapshots]) -> None:
    thr = FakeDevice().throttle(2, sample_every=None)
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)))
    counting = model.last
    joined: list[Any] = []
    recorded: list[Any] = []
    raw = SimpleNamespace(record=lambda stream=None: recorded.append(stream), query=lambda: True,
                          synchronize=lambda: None)
    main = SimpleNamespace(wait_stream=lambda other: joined.append(other))
    event = TorchEvent(raw, None, None, lambda: main, lambda: 0)  # records on cuda:0's current stream, as on CUDA
    completions = inside(thr).values
    counting.current = (7, 0, 1)  # under `with torch.cuda.stream(side):`
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)))
        thr.defer(_FakeCudaTensor(torch.zeros(2)))
        counting.current = (1, 0, 1)  # back on the main stream before the step ends
        completions.before_record(inside(thr).core.steps, event)
        event.record()
    assert [stream.key for stream in joined] == [(7, 0, 1)]  # one join for two copies on the side stream
    assert counting.streams_made == 1
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)))  # on the stream the event records on
        completions.before_record(inside(thr).core.steps, event)
    assert counting.streams_made == 1 and len(joined) == 1


def test_ring_values_through_an_exception_a_break_and_more_passes(model: type[_CountingSnapshots]) -> None:
    """The edges a real loop hits, with CUDA tensors in the ring: a ``step()`` that raises after its defer (that value
    never arrives, and its slot is not written again before the device is done with it), an exception out of a wrapped
    loop (the step it leaves is recorded: its value arrives), a ``break``, and more passes."""
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    arrived: dict[int, list[float]] = {}
    thr.on_complete(lambda step, values: arrived.__setitem__(int(values["x"][0]) // 100, values["x"].tolist()))
    writer: dict[int, int] = {}  # buffer -> the tag of the value copied into it last
    tags = iter(range(1000))
    dropped: list[tuple[int, Any]] = []  # (tag, its Deferred)

    def body() -> tuple[int, Any]:
        tag = next(tags)
        deferred = thr.defer(_FakeCudaTensor(torch.arange(4, dtype=torch.float32) + 100 * tag), name="x")
        buffer = model.last.copies[-1]
        before = writer.get(buffer)
        assert before is None or before in arrived or before in [t for t, _ in dropped], (
            f"the value of tag {tag} overwrites the slot of tag {before} before it arrived")
        writer[buffer] = tag
        dev.launch(1e-3)
        return tag, deferred

    for i in range(5):  # tags 0-4; tag 2's step fails
        try:
            with thr.step():
                made = body()
                if i == 2:
                    dropped.append(made)
                    raise ZeroDivisionError
        except ZeroDivisionError:
            pass
    with pytest.raises(ZeroDivisionError):
        for i in thr.wrap(range(10)):  # tags 5-9: the body raises at tag 9, after its defer
            body()
            if i == 4:
                raise ZeroDivisionError
    for i in thr.wrap(range(10)):  # tags 10-15: a break
        body()
        if i == 5:
            break
    for _ in thr.wrap(range(6)):  # tags 16-21
        body()
    thr.drain()
    assert sorted(arrived) == [t for t in range(22) if t != 2]  # every value but the failed step()'s
    assert all(values == [100.0 * t + k for k in range(4)] for t, values in arrived.items())
    with pytest.raises(RuntimeError, match="never arrive"):
        dropped[0][1].get()
    assert len(model.last.pins) <= 2 + 2  # the ring's slots, each pinned once, across every pass


@pytest.mark.parametrize("bare", [True, False], ids=["torch.cuda.Event", "other"])
def test_events_that_cannot_join_a_stream_order_the_values_after_the_copies_they_do_not_cover(
    model: type[_CountingSnapshots], bare: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """JAX's events and most custom ``events=`` have no ``wait_stream``: a copy on a stream they do not record on gets
    an event of its own recorded after it there (said once), which the host waits for before the value is read, so it
    is never read half written; no stream is synchronized, so torch's work is not serialised with the host's. A bare
    ``torch.cuda.Event`` records on the current device's current stream: the copies there need nothing. The marker
    events are reused once their step retired."""
    dev = FakeDevice()  # its events have no wait_stream
    thr = dev.throttle(2, sample_every=None)
    arrived: list[tuple[list[float], int]] = []  # each value, and how many marker waits came before its delivery
    thr.on_complete(lambda step, values: arrived.append((values["x"].tolist(), len(model.last.waited))))
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)), name="x")
    counting = model.last
    counting.bare = bare
    side, main = (7, 0, 1), (1, 0, 1)
    for i in range(20):
        counting.current = side if i % 2 else main  # odd steps: the copy runs on a side stream
        with thr.step():
            thr.defer(_FakeCudaTensor(torch.full((2,), float(i))), name="x")
            counting.current = main  # back on the main stream before the step ends
            dev.launch(1e-3)
    thr.drain()
    marked = [side if i % 2 else main for i in range(20) if i % 2 or not bare]
    assert counting.synchronized == []  # no stream synchronize()
    assert counting.marked == marked and counting.waited == marked  # each waited for once, at its step's delivery
    assert [value for value, _ in arrived[1:]] == [[float(i)] * 2 for i in range(20)]
    waits_before = [waits for _, waits in arrived[1:]]
    assert waits_before == [len([i for i in range(k + 1) if i % 2 or not bare]) for k in range(20)]
    assert counting.markers_made <= 2 + 2  # reused once their steps retired
    assert sum("cannot be ordered after" in r.getMessage() for r in caplog.records) == 1  # said once per throttle


def test_a_value_whose_copy_an_event_cannot_cover_is_not_ready_until_the_copy_is(
    model: type[_CountingSnapshots],
) -> None:
    """``ready()`` is True only once the step and its uncovered copy are complete; ``get()`` waits for the copy."""
    dev = FakeDevice()
    thr = dev.throttle(4, sample_every=None)
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)), name="x")
    counting = model.last
    counting.bare, counting.copies_done = False, False
    counting.current = (7, 0, 1)
    with thr.step():
        deferred = thr.defer(_FakeCudaTensor(torch.ones(2)), name="x")
    assert not deferred.ready()  # the step is complete on the fake device (no launch); the copy is not
    assert deferred.get().tolist() == [1.0, 1.0] and counting.waited == [(7, 0, 1)]
    counting.copies_done = True
    assert deferred.ready()
    thr.drain()
    assert thr.latest["x"].tolist() == [1.0, 1.0]


def test_a_failed_steps_copies_on_a_side_stream_are_covered_by_the_next_steps_event(
    model: type[_CountingSnapshots],
) -> None:
    """A failed ``step()`` records nothing, but its copies were enqueued and write into ring slots that are taken
    again once the next step of its number retires: that step's event must come after them."""
    dev = FakeDevice()  # its events have no wait_stream: a copy off the current stream is waited for
    thr = dev.throttle(2, sample_every=None)
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)), name="x")
    counting = model.last
    counting.current = (7, 0, 1)  # the failed step's copy runs on a side stream
    with pytest.raises(ZeroDivisionError), thr.step():
        thr.defer(_FakeCudaTensor(torch.ones(2)), name="x")
        counting.current = (1, 0, 1)
        raise ZeroDivisionError
    assert counting.marked == []  # nothing recorded yet
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.full((2,), 2.0)), name="x")  # on the main stream
    assert counting.marked == [(7, 0, 1)]  # the next recorded step covers the failed one's copy
    thr.drain()
    assert counting.waited == [(7, 0, 1)] and counting.synchronized == []


def test_a_sparse_tensor_is_copied_by_torch_on_the_same_stream(model: type[_CountingSnapshots]) -> None:
    """A ring slot holds flat bytes: a sparse (or nested) tensor, whose nbytes raises, takes torch's own non-blocking
    copy, still enqueued on a stream the step's event covers."""
    dev = FakeDevice()
    thr = dev.throttle(2, sample_every=None)
    arrived: list[Any] = []
    thr.on_complete(lambda step, values: arrived.append(values["x"]))
    dense = _FakeCudaTensor(torch.zeros(2))
    sparse = _FakeCudaTensor(torch.ones(2))
    sparse.layout = torch.sparse_coo
    with thr.step():
        thr.defer(dense, name="x")
    counting = model.last
    counting.current, counting.bare = (7, 0, 1), False  # on a side stream the step's event cannot join
    with thr.step():
        thr.defer(sparse, name="x")
        dev.launch(1e-3)
    thr.drain()
    assert sparse.fallback_copies == 1 and len(counting.copies) == 1  # torch's copy, not a ring slot's
    assert counting.marked == [(7, 0, 1)] and counting.waited == [(7, 0, 1)]  # its stream is still covered
    assert arrived[1].tolist() == [1.0, 1.0]


def test_a_throttle_that_rings_one_device_type_refuses_a_tensor_of_another(model: type[_CountingSnapshots]) -> None:
    """The step's event can be ordered after copies on its own kind of device only: a CUDA throttle's deferred XPU
    tensor (or the reverse) would be read before its copy is done, so it is refused, saying what to do."""
    thr = FakeDevice().throttle(2, sample_every=None)
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)), name="x")
    refused = r"got a tensor on xpu, but this throttle's deferred tensors are on cuda.*\.cpu\(\)"
    with pytest.raises(ValueError, match=refused), thr.step():
        thr.defer(_FakeXpuTensor(torch.zeros(2)), name="y")
    with thr.step():  # the throttle goes on
        thr.defer(_FakeCudaTensor(torch.ones(2)), name="x")
    thr.drain()
    assert thr.latest["x"].tolist() == [1.0, 1.0]


def test_the_xpu_copy_model_uses_torch_xpus_own_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TorchSnapshots("xpu")`` keys streams with ``torch._C._xpu_getCurrentStream`` (no Python ``Stream``), makes a
    ``torch.xpu.Stream`` only for a side stream, knows a bare ``torch.xpu.Event`` and records ``torch.xpu.Event``
    markers, reused; other kinds are refused."""
    made: list[dict[str, Any]] = []

    class Stream:
        def __init__(self, **key: Any) -> None:
            made.append(key)

    class Event:
        def record(self, stream: Any) -> None:
            self.stream = stream

    monkeypatch.setattr(torch._C, "_xpu_getCurrentStream", lambda index: (5, index, 12), raising=False)
    monkeypatch.setattr(torch._C, "_xpu_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch.xpu, "Stream", Stream)
    monkeypatch.setattr(torch.xpu, "Event", Event)
    xpu = snapshots.TorchSnapshots("xpu")
    assert xpu.stream_key(1) == (5, 1, 12) and xpu.current_device() == 0
    assert xpu.stream((5, 1, 12)) is xpu.stream((5, 1, 12))  # once per stream
    assert made == [{"stream_id": 5, "device_index": 1, "device_type": 12}]
    assert xpu.bare_event(Event()) and not xpu.bare_event(object())
    marker = xpu.marker((5, 1, 12))  # recorded on that stream, after its copies
    assert isinstance(marker, Event) and marker.stream is xpu.stream((5, 1, 12))
    xpu.release([marker])
    assert xpu.marker((5, 1, 12)) is marker  # recorded again once given back
    with pytest.raises(ValueError, match="mps"):
        snapshots.TorchSnapshots("mps")


def test_a_step_whose_record_fails_leaves_its_side_stream_copies_to_the_next_steps_event(
    model: type[_CountingSnapshots],
) -> None:
    """A record that fails (under CUDA graph capture) drops its step after its values' copies were enqueued: the next
    step's event, a different one, joins their side stream, so the ring slots they write are not taken again before
    the copies are done; the failed event keeps no join for whoever records it next."""
    capturing = [False]
    joined: list[tuple[int, Any]] = []  # (which event, the stream it joined)
    made: list[TorchEvent] = []

    def new_event() -> TorchEvent:
        index = len(made)
        raw = SimpleNamespace(record=lambda stream=None: None, query=lambda: True, synchronize=lambda: None)
        main = SimpleNamespace(wait_stream=lambda other: joined.append((index, other.key)))
        made.append(TorchEvent(raw, None, lambda: capturing[0], lambda: main, lambda: 0))
        return made[-1]

    thr = at.Throttle(2, events=new_event, sample_every=None)
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.zeros(2)), name="x")
    counting = model.last
    counting.current = (7, 0, 1)  # the next step's copy runs on a side stream
    capturing[0] = True
    with pytest.raises(RuntimeError, match="CUDA graph"), thr.step():
        thr.defer(_FakeCudaTensor(torch.ones(2)), name="x")
        counting.current = (1, 0, 1)
    assert joined == [] and made[-1]._after == []  # the failed record joined nothing and keeps nothing
    capturing[0] = False
    with thr.step():
        thr.defer(_FakeCudaTensor(torch.full((2,), 2.0)), name="x")  # on the main stream
    assert joined == [(len(made) - 1, (7, 0, 1))]  # the next step's event covers the failed step's copy
    thr.drain()
    assert thr.latest["x"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("seed", range(12))
def test_random_loops_deliver_every_ring_value_intact_through_every_edge(
    model: type[_CountingSnapshots], seed: int
) -> None:
    """Random loops of deferred CUDA tensors (0-3 a step, of 1, 4 or 1000 floats, a name sometimes twice, some on a
    side stream the FakeDevice's events cannot join) through failed ``step()``s, a ``break``, an exception out of a
    wrapped loop and more passes, at depth 1-3: every value of a step that was not dropped arrives once, as it was
    deferred (a slot written again before its value was copied out would change it); a dropped one says so; the
    pinned slots and the marker events stay bounded, and every marker is waited for."""
    import random

    rng = random.Random(seed)
    dev = FakeDevice()
    thr = dev.throttle(rng.choice([1, 2, 3]), sample_every=rng.choice([None, 1, 8]))
    sent: dict[int, list[float]] = {}  # tag -> the values deferred under it
    got: dict[int, list[float]] = {}
    dropped: list[Any] = []

    def deliver(step: int, values: dict[str, Any]) -> None:
        for value in values.values():
            for tensor in value if isinstance(value, list) else [value]:
                numbers = tensor.tolist()
                tag = int(numbers[0]) // 10_000
                assert tag not in got, f"tag {tag} delivered twice"
                got[tag] = numbers

    thr.on_complete(deliver)
    tags = iter(range(1, 10_000))
    counting: list[_CountingSnapshots] = []

    def body() -> list[Any]:
        made = []
        for k in range(rng.choice([0, 1, 1, 2, 3])):
            tag = next(tags)
            n = rng.choice([1, 4, 4, 1000])
            sent[tag] = [10_000.0 * tag + j for j in range(n)]
            if counting:
                counting[0].current = (7, 0, 1) if rng.random() < 0.3 else (1, 0, 1)
            name = rng.choice(["a", "b", "a"]) if k else "a"
            made.append(thr.defer(_FakeCudaTensor(torch.tensor(sent[tag])), name=name))
            if not counting:  # the ring's copy model, made at the first CUDA tensor
                counting.append(inside(thr).copies.model)
        if counting:
            counting[0].current = (1, 0, 1)
        dev.launch(rng.choice([0.0, 1e-3, 5e-3]))
        return made

    for _ in range(40):
        edge = rng.random()
        if edge < 0.15:  # a step() whose body raises: its values are dropped
            try:
                with thr.step():
                    made = body()
                    raise ZeroDivisionError
            except ZeroDivisionError:
                dropped.extend(made)
        elif edge < 0.3:  # an exception out of a wrapped loop
            with pytest.raises(KeyError):
                for i in thr.wrap(range(rng.randint(1, 6))):
                    body()
                    if i == 0:
                        raise KeyError
        elif edge < 0.45:  # a break
            for i in thr.wrap(range(10)):
                body()
                if i == rng.randint(0, 3):
                    break
        else:  # a whole pass
            for _ in thr.wrap(range(rng.randint(1, 6))):
                body()
    thr.drain()
    for deferred in dropped:
        with pytest.raises(RuntimeError, match="never arrive"):
            deferred.get()
    delivered_or_dropped = set(got) | {t for t in sent if t not in got}
    assert delivered_or_dropped == set(sent)
    assert len(sent) - len(got) == len(dropped)  # exactly the dropped steps' values are missing
    assert all(got[tag] == sent[tag] for tag in got)  # intact: no slot was written before its value was out
    if counting:
        model_ = counting[0]
        assert model_.waited == model_.marked  # every marker, waited for once, in order
        assert model_.markers_made <= 2 * (thr.depth + 2)
        # the ring's slots (3 a step at most), each pinned once and grown at most twice (to 4, then 1000 floats)
        assert len(model_.pins) <= 3 * (thr.depth + 2) * 3
