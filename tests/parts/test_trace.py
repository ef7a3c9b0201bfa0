"""The timeline: host spans that add up to the stats, a bounded ring, device spans, the Chrome trace file."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.trace import Trace
from asyncthrottle.testing import FakeDevice, FakeEvent

MS = 1e-3


def _source(dev: FakeDevice, n: int, fetch_s: float) -> Iterator[int]:
    for i in range(n):
        dev.host(fetch_s)
        yield i


def _load(thr: at.Throttle, tmp_path: Path, name: str = "trace.json") -> dict[str, Any]:
    path = tmp_path / name
    thr.export_trace(path)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _spans(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == name]


def _sum_s(doc: dict[str, Any], name: str) -> float:
    return sum(e["dur"] for e in _spans(doc, name)) / 1e6


def _assert_sums_match(doc: dict[str, Any], stats: at.Stats) -> None:
    assert _sum_s(doc, "fetch") == pytest.approx(stats.fetch_s, abs=1e-8)
    assert _sum_s(doc, "wait") == pytest.approx(stats.wait_s, abs=1e-8)
    assert _sum_s(doc, "body") == pytest.approx(stats.body_s, abs=1e-8)


@pytest.mark.parametrize("depth", [1, 2, 3, None])
@pytest.mark.parametrize(("fetch_ms", "body_ms", "device_ms"), [(0.0, 1.0, 10.0), (10.0, 1.0, 2.0), (2.0, 5.0, 4.0)])
def test_host_spans_add_up_to_the_stats(
    tmp_path: Path, depth: int | None, fetch_ms: float, body_ms: float, device_ms: float
) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth, wait="spin", sample_every=2, trace=1000)
    for _ in thr.wrap(_source(dev, 30, fetch_ms * MS)):
        dev.host(body_ms * MS)
        dev.launch(device_ms * MS)
    doc = _load(thr, tmp_path)
    _assert_sums_match(doc, thr.stats)
    assert len(_spans(doc, "body")) == 30
    assert [e["args"]["step"] for e in _spans(doc, "body")] == list(range(30))
    assert doc["otherData"]["asyncthrottle"]["host_s"]["wait"] == pytest.approx(thr.stats.wait_s)


def test_the_json_has_the_documented_names_and_units(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", sample_every=1, trace=100)
    for _ in thr.wrap(_source(dev, 5, 3 * MS)):
        dev.host(1 * MS)
        dev.launch(10 * MS)
    doc = _load(thr, tmp_path)
    assert set(doc) >= {"traceEvents", "displayTimeUnit", "otherData"}
    kinds = {(e["ph"], e["name"]) for e in doc["traceEvents"]}
    assert {("X", "fetch"), ("X", "body"), ("X", "wait"), ("X", "device"), ("C", "in flight")} <= kinds
    assert {name for ph, name in kinds if ph == "X"} == {"fetch", "body", "wait", "device"}
    tracks = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {e["tid"] for e in _spans(doc, "fetch") + _spans(doc, "body") + _spans(doc, "wait")} == {tracks["host"]}
    assert {e["tid"] for e in _spans(doc, "device")} == {tracks["device (sampled steps)"]}
    assert all(e["dur"] == pytest.approx(3000.0) for e in _spans(doc, "fetch")[:5])  # microseconds
    assert all(e["dur"] == pytest.approx(1000.0) for e in _spans(doc, "body"))
    assert min(e["ts"] for e in doc["traceEvents"] if "ts" in e) == 0.0
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [c["args"]["in flight"] for c in counters] == [0, 0, 0, 0, 0]  # depth 1: the host always waited
    waits = _spans(doc, "wait")
    assert [w["args"]["drain"] for w in waits] == [False] * 4 + [True]
    assert [w["args"]["waited_for"] for w in waits] == [0, 1, 2, 3, 4]
    assert [w["args"]["step"] for w in waits] == [1, 2, 3, 4, 5]  # step 5: after the last step (the drain)
    assert doc["otherData"]["asyncthrottle"]["stats"]["steps"] == 5
    assert doc["otherData"]["asyncthrottle"]["depth"] == 1


def test_the_ring_keeps_exactly_the_last_n_steps(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=1, trace=5)
    for _ in thr.wrap(_source(dev, 40, 1 * MS)):
        dev.host(1 * MS)
        dev.launch(3 * MS)
    doc = _load(thr, tmp_path)
    assert [e["args"]["step"] for e in _spans(doc, "body")] == [35, 36, 37, 38, 39]
    assert {e["args"]["step"] for e in _spans(doc, "fetch")} == {35, 36, 37, 38, 39, 40}  # 40: the final fetch
    assert len([e for e in doc["traceEvents"] if e["ph"] == "C"]) == 5
    assert {e["args"]["step"] for e in _spans(doc, "device")} <= {35, 36, 37, 38, 39}
    meta = doc["otherData"]["asyncthrottle"]
    assert (meta["first_step"], meta["last_step"], meta["steps"], meta["capacity"]) == (35, 39, 5, 5)
    trace = inside(thr).part(Trace)
    assert trace is not None and len(trace._ring) == 5 and len(trace._device) <= 5  # memory stays constant


def test_device_spans_only_for_completed_steps_and_never_before_the_device_finished(tmp_path: Path) -> None:
    dev = FakeDevice()
    events: list[FakeEvent] = []

    def factory() -> FakeEvent:
        events.append(dev.event())
        return events[-1]

    thr = at.Throttle(3, events=factory, wait=dev.wait("spin"), clock=dev.clock, sample_every=1, trace=100)
    seen: list[tuple[int, set[int]]] = []
    for step in thr.wrap(range(12)):
        dev.host(1 * MS)
        dev.launch(5 * MS)
        if step in (4, 9):  # mid-loop exports: steps 2..4 (or 7..9) are still running on the device
            doc = _load(thr, tmp_path, f"mid{step}.json")
            seen.append((inside(thr).core.completed, {e["args"]["step"] for e in _spans(doc, "device")}))
    for completed, steps in seen:
        assert steps and max(steps) < completed
    doc = _load(thr, tmp_path)
    spans = _spans(doc, "device")
    assert {e["args"]["step"] for e in spans} == set(range(1, 12))  # step 0: the events had not shown timing yet
    origin = doc["otherData"]["asyncthrottle"]["clock_origin_s"]
    step_ends = {}  # the device's true end of each step: the time its (timing) event was reached
    for event in events:
        if event.time is not None:
            step_ends.setdefault(len(step_ends), event.time)
    for span in spans:
        assert span["dur"] == pytest.approx(5000.0)
        end_s = origin + (span["ts"] + span["dur"]) / 1e6
        assert end_s >= step_ends[span["args"]["step"]] - 1e-9  # an upper bound on when the step finished


def test_no_device_spans_without_sampling(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=None, trace=100)
    for _ in thr.wrap(range(6)):
        dev.launch(2 * MS)
    doc = _load(thr, tmp_path)
    assert _spans(doc, "device") == [] and len(_spans(doc, "body")) == 6


def test_break_and_a_second_pass_keep_the_sums(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", trace=1000)
    view = thr.wrap(_source(dev, 10, 2 * MS))
    for step in view:
        dev.host(1 * MS)
        dev.launch(4 * MS)
        if step == 5:
            break
    dev.host(1.0)  # between passes (an evaluation): not loop time, not in any span
    for _ in thr.wrap(_source(dev, 10, 2 * MS)):
        dev.host(1 * MS)
        dev.launch(4 * MS)
    doc = _load(thr, tmp_path)
    assert [e["args"]["step"] for e in _spans(doc, "body")] == list(range(16))
    _assert_sums_match(doc, thr.stats)
    assert all(e["dur"] < 0.5e6 for e in doc["traceEvents"] if e["ph"] == "X")


def test_an_exception_records_the_step_it_leaves_with_its_body_span(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", trace=1000)
    with pytest.raises(ZeroDivisionError):
        for step in thr.wrap(_source(dev, 10, 2 * MS)):
            dev.host(1 * MS)
            if step == 3:
                dev.host(7 * MS)
                raise ZeroDivisionError
            dev.launch(4 * MS)
    for _ in thr.wrap(_source(dev, 2, 2 * MS)):  # the next pass goes on from step 4
        dev.host(1 * MS)
        dev.launch(4 * MS)
    doc = _load(thr, tmp_path)
    assert [e["args"]["step"] for e in _spans(doc, "body")] == [0, 1, 2, 3, 4, 5]
    assert _spans(doc, "body")[3]["dur"] == pytest.approx(8 * MS * 1e6)  # the failed body, up to the exception
    stats = thr.stats
    assert _sum_s(doc, "fetch") == pytest.approx(stats.fetch_s)
    assert _sum_s(doc, "wait") == pytest.approx(stats.wait_s)
    assert _sum_s(doc, "body") == pytest.approx(stats.body_s)


def test_step_and_mark_loops(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", trace=100)
    for _ in range(5):
        with thr.step():
            dev.host(1 * MS)
            dev.launch(3 * MS)
        dev.host(2 * MS)  # between steps (a fetch span, Stats' between_s); after the last step, until drain(): body
    thr.drain()
    doc = _load(thr, tmp_path)
    assert len(_spans(doc, "body")) == 5 and len(_spans(doc, "fetch")) == 4
    stats = thr.stats
    assert _sum_s(doc, "fetch") == pytest.approx(stats.fetch_s + stats.between_s)
    assert _sum_s(doc, "wait") == pytest.approx(stats.wait_s)
    assert _sum_s(doc, "body") == pytest.approx(stats.body_s - 2 * MS)  # the tail after the last end_step()

    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", trace=100)
    for _ in range(5):
        dev.host(1 * MS)
        dev.launch(3 * MS)
        thr.mark()
    thr.drain()
    doc = _load(thr, tmp_path, "mark.json")
    assert [e["args"]["step"] for e in _spans(doc, "body")] == [0, 1, 2, 3, 4]
    assert _spans(doc, "body")[0]["dur"] == 0.0  # mark(): the pass begins at the first record
    _assert_sums_match(doc, thr.stats)


def test_a_synchronous_throttle_traces_the_host(tmp_path: Path) -> None:
    thr = at.Throttle(2, device="cpu", trace=10)
    for _ in thr.wrap(range(4)):
        pass
    doc = _load(thr, tmp_path)
    assert len(_spans(doc, "body")) == 4 and _spans(doc, "wait") == [] and _spans(doc, "device") == []
    assert [e["args"]["in flight"] for e in doc["traceEvents"] if e["ph"] == "C"] == [0, 0, 0, 0]


def test_export_from_another_thread_during_a_loop_is_safe(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=1, trace=50)
    stop = threading.Event()
    errors: list[BaseException] = []
    exports = [0]

    def exporter() -> None:
        try:
            while not stop.is_set():
                doc = _load(thr, tmp_path, "other.json")
                steps = [e["args"]["step"] for e in _spans(doc, "body")]
                assert steps == sorted(steps) and len(steps) <= 50
                assert steps == list(range(steps[0], steps[0] + len(steps))) if steps else True
                exports[0] += 1
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=exporter)
    worker.start()
    try:
        for _ in thr.wrap(range(20_000)):
            dev.launch(1 * MS)
            if exports[0] >= 3 and inside(thr).core.steps > 2000:
                break
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert exports[0] >= 1


def test_export_is_atomic_and_reports_a_bad_path(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, trace=10)
    for _ in thr.wrap(range(3)):
        dev.launch(MS)
    with pytest.raises(FileNotFoundError):
        thr.export_trace(tmp_path / "missing" / "trace.json")
    thr.export_trace(str(tmp_path / "t.json"))
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left behind


def test_export_before_any_step(tmp_path: Path) -> None:
    doc = _load(FakeDevice().throttle(2, trace=10), tmp_path)
    assert [e for e in doc["traceEvents"] if e["ph"] != "M"] == []


def test_trace_off_refuses_export_and_adds_no_hooks(tmp_path: Path) -> None:
    thr = FakeDevice().throttle(2)
    with pytest.raises(RuntimeError, match=r"trace=0.*trace=10_000"):
        thr.export_trace(tmp_path / "t.json")
    core = inside(thr).core
    assert not core.on_fetch and not core.on_handout and not core.on_record  # the per-step path is untouched


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", None])
def test_bad_trace_values(bad: object) -> None:
    pattern = r"trace must be an int >= 0.*got " + repr(bad).replace(".", r"\.")
    with pytest.raises((TypeError, ValueError), match=pattern):
        at.Throttle(2, device="cpu", trace=bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_mnist_example_writes_a_trace(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    examples = Path(__file__).resolve().parents[2] / "examples"
    if str(examples) not in sys.path:
        sys.path.insert(0, str(examples))
    import mnist

    out = tmp_path / "mnist.json"
    lines: list[str] = []
    args = mnist.parse_args(["--data", "synthetic", "--device", "cpu", "--no-progress", "--batch-size", "32",
                             "--max-steps", "6", "--epochs", "1", "--trace", str(out)])
    mnist.train(args, log=lines.append)
    doc = json.loads(out.read_text())
    assert [e["args"]["step"] for e in _spans(doc, "body")] == list(range(6))
    assert any(f"trace written to {out}" in line for line in lines)
    assert mnist.parse_args([]).trace is None


def test_the_overhead_benchmark_measures_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from asyncthrottle.bench import overhead

    assert overhead.main(["--trace", "100", "--steps", "2000", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "trace=100 over trace=0" in out and "timeable no-op events" in out
    with pytest.raises(SystemExit):
        overhead.main(["--trace", "0"])
    assert "--trace and --runs must be ints >= 1" in capsys.readouterr().err


def test_a_view_forwards_export_trace(tmp_path: Path) -> None:
    dev = FakeDevice()
    view = at.throttle(range(4), depth=2, events=dev.event, wait=dev.wait("spin"), clock=dev.clock, trace=10)
    for _ in view:
        dev.launch(MS)
    view.export_trace(tmp_path / "v.json")
    assert len(_spans(json.loads((tmp_path / "v.json").read_text()), "body")) == 4


def test_a_framework_that_drops_the_iterator_early(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", trace=10)
    it = iter(thr.wrap(_source(dev, 100, MS)))
    for _ in range(3):
        next(it)
        dev.host(MS)
        dev.launch(2 * MS)
    del it  # never exhausted: the step in progress is recorded, the pass ends
    doc = _load(thr, tmp_path)
    assert [e["args"]["step"] for e in _spans(doc, "body")] == [0, 1, 2]
    _assert_sums_match(doc, thr.stats)


def test_a_wait_that_times_out_is_a_span(tmp_path: Path) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", timeout=0.005, trace=10)
    with pytest.raises(at.ThrottleTimeout):
        for _ in thr.wrap(range(3)):
            dev.launch(1.0)  # a hung step
    doc = _load(thr, tmp_path)
    waits = _spans(doc, "wait")
    assert len(waits) == 1 and waits[0]["dur"] == pytest.approx(5000.0, rel=0.01)
    assert _sum_s(doc, "wait") == pytest.approx(thr.stats.wait_s)


@pytest.mark.cuda
def test_a_real_cuda_loop_has_device_spans_and_nvtx(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(1024, 1024, device="cuda")
    thr = at.Throttle(2, device="cuda", sample_every=2, trace=100, nvtx=True)
    for _ in thr.wrap(range(20)):
        for _ in range(4):
            x = torch.tanh(x @ x)
    doc = _load(thr, tmp_path)
    device = _spans(doc, "device")
    assert device and {e["args"]["step"] for e in device} <= set(range(0, 20, 2))
    assert all(e["dur"] > 0 for e in device)
    stats = thr.stats
    assert _sum_s(doc, "fetch") == pytest.approx(stats.fetch_s) and _sum_s(doc, "wait") == pytest.approx(stats.wait_s)
    assert 0 <= stats.body_s - _sum_s(doc, "body") < 5e-3  # a real clock: the bookkeeping between spans
