"""Telemetry, verdicts, deferred values, callbacks, the progress bar and hidden-sync detection."""

from __future__ import annotations

import io
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import inside

import asyncthrottle as at
from asyncthrottle.parts.timing import DeviceTiming, Sampling
from asyncthrottle.testing import FakeDevice

torch = pytest.importorskip("torch")
MS = 1e-3


@pytest.fixture(autouse=True, params=["shared", "separate"])
def timing_events(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: with the steps' own events timed (JAX, events=: the fake device's) and with
    a timing factory of their own (CUDA's), whose sampled steps' starts the part supplies itself."""
    if request.param == "separate":
        import sys

        # (the package's `throttle` is the function: the module is sys.modules')
        throttle_module = sys.modules["asyncthrottle._lifecycle"]
        resolve = throttle_module.resolve_backend

        def separate(*args: Any, **kwargs: Any) -> Any:
            backend = resolve(*args, **kwargs)
            if backend.timed is not None and backend.timed is backend.events:
                timed = backend.timed
                backend.timed = lambda: timed()  # the same events, another factory
            return backend

        monkeypatch.setattr(throttle_module, "resolve_backend", separate)
    return str(request.param)


def _source(dev: FakeDevice, n: int, fetch_s: float) -> Iterator[int]:
    for i in range(n):
        dev.host(fetch_s)  # taking the batch costs the host fetch_s
        yield i


def _loop(depth: int | None, *, fetch_s: float, body_s: float, device_s: float, n: int = 20) -> at.Throttle:
    """A scripted loop on the fake device: fetch, host work, then launch the step's device work."""
    dev = FakeDevice()
    thr = dev.throttle(depth, wait="spin", sample_every=1)
    for _ in thr.wrap(_source(dev, n, fetch_s)):
        dev.host(body_s)
        dev.launch(device_s)
    return thr


def test_device_bound_loop() -> None:
    s = _loop(2, fetch_s=0.0, body_s=0.001, device_s=0.010).stats
    assert s.verdict == "device-bound"
    assert s.wall_s == pytest.approx(0.201)  # 1 ms to launch step 0, then 20 x 10 ms back to back
    assert s.wait_s == pytest.approx(0.201 - 20 * 0.001)
    # Steps 1..19 are timed (events= backends are known to time only once the first event exists).
    assert s.device_samples == 19
    assert s.device_ms_p50 == pytest.approx(10.0) and s.device_ms_mean == pytest.approx(10.0)
    assert s.device_idle_s == pytest.approx(0.0) and s.idle_fraction == pytest.approx(0.0)
    assert s.device_busy_s == pytest.approx(0.200)
    assert s.starved_fraction == pytest.approx(1 / 20)  # only step 0 starts on an idle device
    assert s.in_flight_histogram == (1, 19, 0)


def test_both_ways_of_timing_are_tested(timing_events: str) -> None:
    thr = _loop(2, fetch_s=0.0, body_s=0.001, device_s=0.010)
    timing = inside(thr).part(DeviceTiming)
    assert timing is not None and timing._shared == (timing_events == "shared")
    assert thr.stats.device_samples == 19


def test_input_bound_loop(timing_events: str) -> None:
    s = _loop(2, fetch_s=0.010, body_s=0.001, device_s=0.001).stats
    assert s.verdict == "input-bound"
    assert s.waits == 1 and s.wait_s == pytest.approx(0.001)  # only the drain, for the last step
    assert s.fetch_s == pytest.approx(0.200)
    assert s.body_s == pytest.approx(0.020)
    # Each step: 10 ms fetching while the device, done after 2 ms, sits idle for 9 ms.
    assert s.device_ms_p50 == pytest.approx(2.0)
    # steps 1..19: step 0 is never timed (step 1, handed out idle before its record showed that the
    # fake device's events have elapsed_time, is timed too); totals extrapolated to 20 steps
    assert s.device_samples == 19
    assert s.device_idle_s == pytest.approx(20 * 0.009)
    assert s.idle_fraction == pytest.approx(9 / (9 + 2))
    assert s.starved_fraction == 1.0


def test_host_bound_loop() -> None:
    s = _loop(2, fetch_s=0.0, body_s=0.010, device_s=0.001).stats
    assert s.verdict == "host-bound"
    assert s.waits == 1 and s.body_s == pytest.approx(0.200)  # one wait: the drain
    assert s.steps_per_s == pytest.approx(20 / 0.201)  # the drain's 1 ms is part of the loop


def test_depth_bound_at_depth_1_becomes_device_bound_at_depth_2() -> None:
    one = _loop(1, fetch_s=0.0, body_s=0.004, device_s=0.006).stats
    two = _loop(2, fetch_s=0.0, body_s=0.004, device_s=0.006).stats
    assert one.verdict == "depth-bound" and one.starved_fraction == 1.0
    assert one.wall_s == pytest.approx(20 * 0.010)  # host and device take turns
    assert two.verdict == "device-bound" and two.starved_fraction == pytest.approx(1 / 20)
    assert two.wall_s == pytest.approx(0.004 + 20 * 0.006)  # they overlap: the device never waits
    assert two.steps_per_s > 1.5 * one.steps_per_s


def test_sampling_every_kth_step_extrapolates_totals() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=4)
    for _ in thr.wrap(range(40)):
        dev.launch(0.010)
    s = thr.stats
    assert s.device_samples == 9  # steps 4, 8, ..., 36 (step 0 is never timed)
    assert s.device_busy_s == pytest.approx(0.400)  # 9 samples of 10 ms, scaled to 40 steps
    assert dev.records == 40  # one event per step: the device was never idle at a sampled hand-out


@pytest.fixture
def trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake device's events known to have elapsed_time, as a built-in backend's: an idle
    hand-out of a sampled step gets a start marker from the first."""
    import sys

    throttle_module = sys.modules["asyncthrottle._lifecycle"]
    resolve = throttle_module.resolve_backend

    def trusting(*args: Any, **kwargs: Any) -> Any:
        backend = resolve(*args, **kwargs)
        backend.trusted = True
        return backend

    monkeypatch.setattr(throttle_module, "resolve_backend", trusting)


@pytest.mark.parametrize("failed_first", [False, True])
@pytest.mark.parametrize("every", [1, 8])
def test_the_first_step_is_not_timed(every: int, failed_first: bool, trusted: None) -> None:
    """Step 0 carries one-time host work with the device idle (JAX compiles the step in its first
    call, cuDNN autotunes, modules initialise lazily): timed from its hand-out, one such sample was
    the mean's and the totals' whole figure (a JAX loop read 4.58 ms/step, p50 0.08)."""
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=every)
    if failed_first:
        # step 0's body raised (end_step(failed=True)): the step that takes its number is untimed too
        thr.begin_step()
        dev.host(1.0)
        thr.end_step(failed=True)
        assert thr.stats.steps == 0
    for step in thr.wrap(range(40)):
        dev.host(1.0 if step == 0 else 0.001)  # the first call compiles
        dev.launch(0.002)
    s = thr.stats
    assert s.device_samples == (39 if every == 1 else 4)  # steps 1..39, or 8, 16, 24, 32
    assert s.device_ms_mean == pytest.approx(2.0) and s.device_ms_p90 == pytest.approx(2.0)
    assert s.device_busy_s == pytest.approx(40 * 0.002)  # extrapolated, and less than the wall
    assert s.device_busy_s < s.wall_s - (1.0 if failed_first else 0.0)


def test_a_starved_loop_marks_the_start_of_every_sampled_step_but_step_0(trusted: None) -> None:
    dev = FakeDevice()
    thr = dev.throttle(1, wait="spin", sample_every=1)
    for _ in thr.wrap(range(5)):
        dev.host(0.001)
        dev.launch(0.002)
    # each step's event, and a start marker at the idle hand-outs of steps 1..4: none at step 0
    assert dev.records == 5 + 4 and thr.stats.device_samples == 4
    assert thr.stats.device_ms_p50 == pytest.approx(3.0)  # from the hand-out: the body's 1 ms too


def test_the_first_sampled_step_is_timed_when_its_hand_out_finds_the_device_idle() -> None:
    """A slow host (a busy machine) starves the device: the first sampled step is handed out idle
    before its record has shown that the events can be timed. Its start went unmarked, so its
    sample was lost (3 of 4)."""
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=8)
    for _ in thr.wrap(_source(dev, 40, 0.005)):  # slower than the device: every hand-out is idle
        dev.launch(0.002)
    s = thr.stats
    assert s.device_samples == 4  # steps 8, 16, 24 and 32
    assert s.device_ms_p50 == pytest.approx(2.0)


def test_memory_stays_bounded_over_many_steps() -> None:
    dev = FakeDevice()
    thr = dev.throttle(None, wait="spin", sample_every=1)
    for _ in thr.wrap(range(5000)):
        thr.defer(1.0, name="loss")
        dev.launch(0.001)
        dev.host(0.001)
    assert len(inside(thr).core.pending) <= 2 and not inside(thr).values.recorded and not inside(thr).values.open
    assert inside(thr).part(DeviceTiming) is not None
    timing = inside(thr).part(DeviceTiming)
    assert len(timing.ends) <= 2 and timing._start is None and len(timing.times._recent) == 1024
    assert len(thr.stats.in_flight_histogram) == 64


def test_as_dict_is_flat_and_summary_reads_well() -> None:
    thr = _loop(2, fetch_s=0.0, body_s=0.001, device_s=0.010)
    flat = thr.stats.as_dict()
    assert all(isinstance(v, (int, float, str)) for v in flat.values())
    assert flat["verdict"] == "device-bound" and flat["in_flight_hist_1"] == 19
    text = thr.summary()
    assert "20 steps" in text and "device-bound" in text and "ms/step" in text


def _counted_loop(defer: bool) -> tuple[int, int, list[tuple[int, float]]]:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=None)
    logged: list[tuple[int, float]] = []
    if defer:
        thr.on_complete(lambda step, values: logged.append((step, float(values["loss"]))))
    for i in thr.wrap(range(10)):
        dev.launch(0.010)
        if defer:
            thr.defer(torch.tensor(float(i)), name="loss")
    return dev.syncs, dev.queries, logged


def test_deferred_logging_adds_no_sync_and_no_query() -> None:
    plain_syncs, plain_queries, _ = _counted_loop(defer=False)
    syncs, queries, logged = _counted_loop(defer=True)
    assert (syncs, queries) == (plain_syncs, plain_queries)
    assert logged == [(i, float(i)) for i in range(10)]  # every step, in order


def test_deferred_get_waits_for_its_step_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a device-wide sync"))
    dev = FakeDevice()
    thr = dev.throttle(None, wait="spin")
    values = {}
    for i in thr.wrap(range(5), ):
        dev.launch(0.010)
        values[i] = thr.defer({"loss": torch.tensor(float(i)), "acc": [torch.tensor(0.5)]})
        if i == 4:
            assert not values[2].ready()
            with pytest.raises(RuntimeError, match="step 4 has not ended yet"):
                values[4].get()
            got = values[2].get()
            assert dev.clock() == pytest.approx(0.030)  # the end of step 2, not of step 4
            assert got["loss"].item() == 2.0 and got["acc"][0].item() == 0.5
            assert values[2].ready() and values[1].ready() and not values[3].ready()
            assert thr.stats.waits == 1 and thr.stats.wait_s == pytest.approx(0.030)  # one wait, on step 2
    assert thr.latest["value"]["loss"].item() == 4.0


def test_deferred_snapshots_the_value_and_converts_to_float() -> None:
    thr = at.Throttle(2, device="cpu")
    metric = torch.zeros(())
    seen = []
    for _ in thr.wrap(range(3)):
        metric += 1
        seen.append(thr.defer(metric, name="count"))
    assert [float(d) for d in seen] == [1.0, 2.0, 3.0]  # copies, not the tensor updated in place
    assert seen[0].item() == 1.0 and "ready" in repr(seen[0])
    assert thr.latest["count"].item() == 3.0


def test_on_complete_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match="on_complete needs a callable"):
        at.Throttle(2, device="cpu").on_complete(3)  # type: ignore[arg-type]


def test_progress_bar_shows_device_state_without_blocking() -> None:
    tqdm = pytest.importorskip("tqdm")
    dev = FakeDevice()
    out = io.StringIO()
    view = at.throttle(range(6), depth=2, events=dev.event, wait=dev.wait("spin"), clock=dev.clock,
                       progress={"file": out, "mininterval": 0, "tqdm_class": tqdm.tqdm})
    for i in view:
        dev.launch(0.010)
        view.defer(torch.tensor(i / 10), name="loss")
    text = out.getvalue()
    assert "6/6" in text and "done=6" in text and "inflight=0" in text and "loss=0.5" in text
    syncs_with_bar = dev.syncs
    dev2 = FakeDevice()
    for _ in at.throttle(range(6), depth=2, events=dev2.event, wait=dev2.wait("spin"), clock=dev2.clock):
        dev2.launch(0.010)
    assert syncs_with_bar == dev2.syncs


def test_progress_accepts_a_tqdm_like_class_and_rejects_nonsense() -> None:
    made: list[dict[str, Any]] = []

    class Bar:
        mininterval = 0.0

        def __init__(self, **options: Any) -> None:
            made.append(options)
            self.n = 0

        def update(self, n: int) -> None:
            self.n += n

        def set_postfix_str(self, text: str, refresh: bool = True) -> None:
            self.postfix = text

        def close(self) -> None:
            made.append({"closed": self.n})

    for _ in at.throttle([1, 2, 3], device="cpu", progress=Bar):
        break
    assert made == [{"total": 3}, {"closed": 1}]  # a break closes the bar
    with pytest.raises(TypeError, match="progress must be True, False"):
        at.throttle([1], device="cpu", progress=5)


def test_detect_sync_covers_the_body_only(fake_cuda: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    mode = SimpleNamespace(value=0)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode.value)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: setattr(mode, "value", m))
    thr = at.Throttle(1, device="cuda", detect_sync="warn")
    for _ in thr.wrap(range(3)):
        assert mode.value == "warn"
    assert mode.value == 0
    with pytest.raises(KeyError):
        for _ in thr.wrap(range(3)):
            raise KeyError("in the body")
    assert mode.value == 0  # restored after an exception too
    with pytest.raises(KeyError), thr.step():
        assert mode.value == "warn"
        raise KeyError("in the body")
    assert mode.value == 0


def test_detect_sync_elsewhere_warns_once_and_works() -> None:
    with pytest.warns(RuntimeWarning, match="needs CUDA"):
        thr = at.Throttle(2, device="cpu", detect_sync="error")
    assert list(thr.wrap(range(2))) == [0, 1]
    with pytest.raises(ValueError, match="detect_sync must be 'warn', 'error' or None"):
        at.Throttle(2, device="cpu", detect_sync="loud")


def test_bad_sample_every() -> None:
    with pytest.raises(ValueError, match="sample_every must be an int >= 1"):
        at.Throttle(2, device="cpu", sample_every=0)


@pytest.mark.cuda
def test_detect_sync_reports_item_in_the_body_for_real() -> None:
    x = torch.ones(8, device="cuda")
    with pytest.warns(UserWarning, match="synchroniz"):
        for _ in at.throttle(range(2), depth=1, device="cuda", detect_sync="warn"):
            (x * 2).sum().item()
    assert torch.cuda.get_sync_debug_mode() == 0


def test_deferred_jax_arrays_arrive_on_the_host() -> None:
    jax = pytest.importorskip("jax")
    thr = at.Throttle(2, device="jax")
    got: list[float] = []
    thr.on_complete(lambda step, values: got.append(float(values["x"])))
    for i in thr.wrap(range(3)):
        thr.defer(jax.numpy.ones((), jax.numpy.float32) * i, name="x")  # copy_to_host_async, read later
    assert got == [0.0, 1.0, 2.0]
    assert type(thr.latest["x"]).__module__ == "numpy"


@pytest.mark.parametrize(
    ("depth", "host_s", "device_s", "expected"),
    [
        (None, 0.001, 0.010, "device-bound"),  # runs ahead, never waits: the busy device is still the limit
        (2, 0.001, 0.010, "device-bound"),
        (None, 0.010, 0.001, "host-bound"),
    ],
)
def test_the_verdict_names_a_busy_device_even_when_the_host_never_waits(
    depth: int | None, host_s: float, device_s: float, expected: str
) -> None:
    dev = FakeDevice()
    thr = dev.throttle(depth, wait="spin")
    for _ in thr.wrap(range(200)):
        dev.host(host_s)
        dev.launch(device_s)
    assert thr.stats.verdict == expected


def test_the_sampling_rule_every_kth_step_never_step_0() -> None:
    assert [n for n in range(20) if Sampling(8).sampled(n)] == [8, 16]
    assert [n for n in range(4) if Sampling(1).sampled(n)] == [1, 2, 3]  # step 0 never
    assert not any(Sampling(None).sampled(n) for n in range(20)) and not Sampling(None).on
    assert Sampling.of({"sample_every": 3}).every == 3 and Sampling(None).per_sample() == 1


@pytest.mark.parametrize("every", [1, 3])
def test_device_timing_and_sections_sample_the_same_steps(every: int) -> None:
    """One rule says which steps are sampled: device timing times them, sections time their phases."""
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=every)
    timed: list[int] = []
    sectioned: list[int] = []

    class Heard(at.Subscriber):
        def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
            timed.append(step)

        def on_sections(self, step: int, own_s: float, seconds: dict[str, float]) -> None:
            sectioned.append(step)

    thr.subscribe(Heard())
    for _ in thr.wrap(range(10)):
        with thr.section("forward"):
            dev.launch(0.002)
    assert timed == sectioned == [n for n in range(10) if Sampling(every).sampled(n)]


def test_a_subscriber_hears_each_sample_as_its_step_retires() -> None:
    """``Subscriber.on_sample``: told by device timing through the core's list; while one listens, the
    samples are read as their steps retire (not a cycle later)."""
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=4)
    core = inside(thr).core
    heard: list[tuple[int, float, float, int, int]] = []

    class Samples(at.Subscriber):
        def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
            heard.append((step, busy_s, idle_s, core.completed, core.steps))

    thr.subscribe(Samples())
    for _ in thr.wrap(_source(dev, 13, 0.0)):
        dev.launch(4 * MS)
    assert [h[0] for h in heard] == [4, 8, 12]
    assert all(h[1] == pytest.approx(4 * MS) and h[2] == 0.0 for h in heard)
    # retired, and heard before the next sampled step was recorded (lazily it would be read there)
    assert all(step < completed and recorded < step + 4 for step, _, _, completed, recorded in heard)


def test_a_sample_subscriber_that_raises_hides_it_from_no_other_and_timing_goes_on() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=2)
    heard: list[int] = []

    class Raising:
        def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
            if step == 2:
                raise ValueError("a user's sample hook")

    class Listening:
        def on_sample(self, step: int, busy_s: float, idle_s: float) -> None:
            heard.append(step)

    thr.subscribe(Raising())
    thr.subscribe(Listening())
    with pytest.raises(ValueError, match="a user's sample hook"):
        for _ in thr.wrap(_source(dev, 9, 0.0)):
            dev.launch(4 * MS)
    assert heard == [2]  # told before the error reached the loop
    for _ in thr.wrap(_source(dev, 4, 0.0)):
        dev.launch(4 * MS)
    timing = inside(thr).part(DeviceTiming)
    assert timing.enabled and heard[1:] and thr.stats.device_samples >= 2  # device timing is still on
