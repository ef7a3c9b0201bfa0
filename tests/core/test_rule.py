"""The depth rule (docs/depth-rule.md, docs/architecture.md), checked call by call against a reference model."""

from __future__ import annotations

import pytest
from helpers import Script, inside
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncthrottle as at
from asyncthrottle.core.loop import StepIterator
from asyncthrottle.testing import FakeDevice


def _run(script: Script, n: int, depth: int | None, *, stop_at: int | None = None, how: str = "break",
         drain: bool = True, thr: at.Throttle | None = None) -> list[dict[str, object]]:
    """Run a wrapped loop (on ``thr`` if given); at each body, note which events were complete."""
    if thr is None:
        thr = at.Throttle(depth, events=script, wait="spin", drain=drain)
    seen = []
    try:
        for step in thr.wrap(script.source(n)):
            seen.append({"step": step, "complete": [e.complete() for e in script.events], "log_len": len(script.log)})
            script.log.append(("body", step))
            script.clock[0] += 1
            if step == stop_at:
                if how == "break":
                    break
                raise KeyError("boom")
    except KeyError:
        pass
    return seen


def _check_rule(script: Script, seen: list[dict[str, object]], n: int, depth: int | None,
                stop_at: int | None, drain: bool, how: str = "break") -> None:
    log = script.log
    # One event per finished step, recorded once, after its body and before the next fetch. Leaving the
    # loop in any way (a break, an exception) records the step it leaves: its work is enqueued.
    finished = n if stop_at is None else stop_at + 1
    assert [e.recorded for e in script.events] == [1] * finished
    for k in range(finished):
        at_record = log.index(("record", k))
        assert log.index(("body", k)) < at_record
        if k + 1 < len(seen):
            assert at_record < log.index(("fetch", k + 1))
    for view in seen:
        step = view["step"]
        assert isinstance(step, int)
        complete = view["complete"]
        assert isinstance(complete, list)
        # Bound: every step <= n - depth has completed when step n starts.
        if depth is not None:
            assert all(complete[: max(0, step - depth + 1)])
        # Minimal blocking + overlap: syncs before body n come after fetch n and only for steps <= n - depth.
        start = log.index(("fetch", step))
        end = log.index(("body", step))
        syncs = [i for kind, i in log[start:end] if kind == "sync"]
        limit = -1 if depth is None else step - depth
        assert all(i <= limit for i in syncs), (step, syncs)
        before_fetch = log[log.index(("record", step - 1)) : start] if step else []
        assert not [entry for entry in before_fetch if entry[0] == "sync"]
    tail_start = max((i for i, entry in enumerate(log) if entry[0] in ("body", "record", "fetch")), default=0)
    tail_syncs = [i for kind, i in log[tail_start:] if kind == "sync"]
    if stop_at is not None or not drain:
        assert tail_syncs == []  # a break, an exception, or drain=False never blocks at the end
    else:
        assert all(e.complete() for e in script.events)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 25),
    depth=st.one_of(st.none(), st.integers(1, 5)),
    ready=st.lists(st.floats(0, 40, allow_nan=False), min_size=25, max_size=25),
    stop=st.one_of(st.none(), st.tuples(st.integers(0, 24), st.sampled_from(["break", "raise"]))),
    drain=st.booleans(),
)
def test_depth_rule_matches_reference_model(
    n: int, depth: int | None, ready: list[float], stop: tuple[int, str] | None, drain: bool
) -> None:
    stop_at, how = (stop if stop is not None and stop[0] < n else (None, "break"))
    script = Script(ready)
    seen = _run(script, n, depth, stop_at=stop_at, how=how, drain=drain)
    assert [v["step"] for v in seen] == list(range(n if stop_at is None else stop_at + 1))
    _check_rule(script, seen, n, depth, stop_at, drain, how)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_device_that_never_finishes_waits_exactly_for_step_n_minus_depth(depth: int) -> None:
    script = Script([])
    _run(script, 8, depth, drain=False)
    syncs = [i for kind, i in script.log if kind == "sync"]
    assert syncs == list(range(8 - depth))


def test_depth_none_never_blocks_but_tracks() -> None:
    script = Script([3.0] * 10)
    thr = at.Throttle(None, events=script, wait="spin", drain=False)
    for _ in thr.wrap(script.source(10)):
        script.clock[0] += 1
    assert not [e for e in script.log if e[0] == "sync"]
    assert thr.stats.steps == 10
    assert thr.stats.max_in_flight == 3  # steps 0..2 were in flight until the clock passed 3
    assert thr.in_flight == 0


def test_step_context_and_mark_follow_the_same_rule() -> None:
    script = Script([])
    thr = at.Throttle(2, events=script, wait="spin")
    for i in range(5):
        with thr.step() as n:
            assert n == i
    assert [i for kind, i in script.log if kind == "sync"] == [0, 1, 2]
    script2 = Script([])
    thr2 = at.Throttle(2, events=script2, wait="spin")
    for _ in range(5):
        thr2.mark()  # record step i, then wait for room for step i + 1
    assert [i for kind, i in script2.log if kind == "sync"] == [0, 1, 2, 3]
    thr2.drain()
    assert thr2.stats.completed == 5 and thr2.in_flight == 0


def test_exception_in_step_records_nothing_and_blocks_on_nothing() -> None:
    script = Script([])
    thr = at.Throttle(1, events=script, wait="spin")
    with thr.step():
        pass
    with pytest.raises(ValueError), thr.step():
        raise ValueError("in the body")
    assert len(script.events) == 1
    assert [i for kind, i in script.log if kind == "sync"] == [0]  # only the wait to enter the 2nd step
    with thr.step() as n:
        assert n == 1


def test_reiterating_starts_a_new_pass_and_len_is_the_sources() -> None:
    view = at.throttle([1, 2, 3], depth=1, device="cpu")
    assert len(view) == 3
    assert list(view) == [1, 2, 3]
    assert list(view) == [1, 2, 3]
    assert view.stats.steps == 6
    with pytest.raises(TypeError, match="has no len"):
        len(at.throttle(iter([1]), device="cpu"))


def test_fsdp_free_event_queue_makes_the_same_decisions_at_depth_2() -> None:
    limiter = pytest.importorskip("torch.distributed.fsdp._limiter_utils")
    ours = Script([])
    for _ in at.throttle(ours.source(12), depth=2, events=ours, wait="spin", drain=False):
        pass
    theirs = Script([])
    queue = limiter._FreeEventQueue()
    for _ in theirs.source(12):
        event = queue.dequeue_if_needed()  # FSDP: before each all-gather
        if event is not None:
            event.synchronize()
        event = theirs()
        event.record()  # FSDP: after each reshard
        queue.enqueue(event)
    assert ours.log == theirs.log


@settings(max_examples=100, deadline=None)
@given(ready=st.lists(st.integers(0, 30), min_size=15, max_size=15))
def test_fsdp_parity_when_the_device_finishes_steps_on_its_own(ready: list[int]) -> None:
    limiter = pytest.importorskip("torch.distributed.fsdp._limiter_utils")
    ours = Script([float(r) for r in ready])
    required: list[int] = []
    for step in at.throttle(ours.source(15), depth=2, events=ours, wait="spin", drain=False):
        required.append(step - 2)
        assert all(e.complete() for e in ours.events[: max(0, step - 1)])
        ours.clock[0] += 1
    theirs = Script([float(r) for r in ready])
    queue = limiter._FreeEventQueue()
    dequeued: list[int] = []
    for _ in theirs.source(15):
        event = queue.dequeue_if_needed()
        dequeued.append(event.index if event is not None else -2)  # type: ignore[attr-defined]
        if event is not None:
            event.synchronize()
        event = theirs()
        event.record()
        queue.enqueue(event)
        theirs.clock[0] += 1
    assert [r if r >= 0 else -2 for r in required] == dequeued  # the same step becomes required at the same time
    our_syncs = [i for kind, i in ours.log if kind == "sync"]
    their_incomplete = [i for kind, i in theirs.log if kind == "sync" and ready[i] > i + 2]
    assert our_syncs == their_incomplete  # we block only where FSDP's sync had to block


class _Listener:
    """A part that hears every step: a loop's next() then runs record() and admit(), not its
    lean road."""

    def __init__(self) -> None:
        self.handouts: list[tuple[int, int]] = []

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self.handouts.append((step, in_flight))

    def on_record(self, step: int, event: object, now: float) -> None:
        pass


def _counters(thr: at.Throttle) -> dict[str, object]:
    core = inside(thr).core
    return {"steps": core.steps, "completed": core.completed, "histogram": list(core.histogram),
            "dry": core.dry, "last_dry": core.last_dry, "max_in_flight": core.max_in_flight,
            "waits": core.waits, "pending": len(core.pending)}


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 25),
    depth=st.integers(1, 4),
    ready=st.lists(st.floats(0, 40, allow_nan=False), min_size=25, max_size=25),
    stop=st.one_of(st.none(), st.tuples(st.integers(0, 24), st.sampled_from(["break", "raise"]))),
)
def test_the_lean_road_decides_exactly_as_record_and_admit(
    n: int, depth: int, ready: list[float], stop: tuple[int, str] | None
) -> None:
    stop_at, how = (stop if stop is not None and stop[0] < n else (None, "break"))
    runs = []
    for listened in (False, True):
        script = Script(ready)
        thr = at.Throttle(depth, events=script, wait="spin")
        listener = _Listener()
        if listened:
            thr.subscribe(listener)
        assert inside(thr).core.lean is not listened
        _run(script, n, depth, stop_at=stop_at, how=how, thr=thr)
        runs.append((script.log, _counters(thr)))
    assert runs[0] == runs[1]  # the same records, queries, syncs, in the same order; the same counters


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 25),
    depth=st.integers(1, 4),
    ready=st.lists(st.floats(0, 40, allow_nan=False), min_size=25, max_size=25),
    stop=st.one_of(st.none(), st.integers(0, 24)),
)
def test_core_step_on_a_lean_core_is_record_fetch_admit(
    n: int, depth: int, ready: list[float], stop: int | None
) -> None:
    """The core's lean road (a StepIterator's next() while lean) against the general methods it
    inlines, called one by one on the same script: the same calls on the events, the same
    counters."""
    runs = []
    for lean in (True, False):
        script = Script(ready)
        thr = at.Throttle(depth, events=script, wait="spin", sample_every=None)
        core = inside(thr).core
        assert core.lean
        source = script.source(n)
        steps = StepIterator(core, source)
        for i in range(n):
            if lean:
                item = next(steps)
            else:
                if i:
                    core.record(0.0)
                item = next(source)
                core.admit()
            assert item == i
            script.log.append(("body", i))
            script.clock[0] += 1
            if i == stop:
                break
        # (held: never used, no step waits in vain)
        runs.append((script.log, _counters(thr), steps._held))
    assert runs[0] == runs[1]


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, 3),
    every=st.integers(1, 4),
    steps=st.lists(st.tuples(st.floats(0, 0.004), st.floats(0, 0.004)), min_size=1, max_size=30),
)
def test_device_timing_reads_the_same_samples_on_either_path(
    depth: int, every: int, steps: list[tuple[float, float]]
) -> None:
    results = []
    for listened in (False, True):
        dev = FakeDevice()
        thr = dev.throttle(depth, wait="spin", sample_every=every)
        if listened:
            thr.subscribe(_Listener())
        for device_s, host_s in thr.wrap(steps):
            dev.launch(device_s)
            dev.host(host_s)
        stats = thr.stats
        results.append((_counters(thr), stats.device_samples, stats.device_busy_s, stats.device_idle_s))
    assert results[0] == results[1]


def test_the_core_is_lean_only_while_no_part_hears_a_step() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    core = inside(thr).core
    assert core.lean  # defaults: device timing supplies events but hears no step
    listener = _Listener()
    thr.subscribe(listener)
    assert not core.lean
    thr.unsubscribe(listener)
    assert core.lean
    core.listen("on_retire", listener.on_record)
    assert not core.lean
    core.unlisten("on_retire", listener.on_record)
    assert core.lean
    core.set_depth(None)  # track only: the general path
    assert not core.lean
    core.set_depth(64)  # deeper than the histogram's buckets: the general path folds the last one
    assert not core.lean
    core.set_depth(3)
    assert core.lean
    assert not inside(at.Throttle(2, device="cpu")).core.lean  # synchronous
    assert not inside(dev.throttle(2, max_memory=at.MemoryBudget(1 << 30, probe=lambda: 0))).core.lean  # a hold


def test_a_part_hears_each_batch_a_wrapped_loop_takes_after_its_fetch_and_none_of_a_step_loop() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    core = inside(thr).core
    heard: list[tuple[str, int, object]] = []

    class Batches:
        def on_fetch(self, step: int, start: float, seconds: float) -> None:
            heard.append(("fetch", step, None))

        def on_batch(self, step: int, batch: object) -> None:
            heard.append(("batch", step, batch))

    assert not core.hears_fetch  # (the step road's one truth test for both)
    part = Batches()
    thr.subscribe(part)
    assert core.hears_fetch and not core.lean
    for _ in thr.wrap("ab"):
        dev.launch(0.001)
    with thr.step():
        pass
    assert heard == [("fetch", 0, None), ("batch", 0, "a"), ("fetch", 1, None), ("batch", 1, "b"),
                     ("fetch", 2, None)]  # the source's end: a fetch, no batch; a step loop's step: none
    thr.unsubscribe(part)
    assert not core.hears_fetch and core.lean


def test_a_part_that_subscribes_or_unsubscribes_while_told_changes_the_next_notification_only() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    heard: list[tuple[str, int]] = []

    class Late:
        def on_record(self, step: int, event: object, now: float) -> None:
            heard.append(("late", step))

    late = Late()

    class Early:
        def on_record(self, step: int, event: object, now: float) -> None:
            heard.append(("early", step))
            if step == 0:
                thr.subscribe(late)  # told from step 1 on, not of step 0
            if step == 1:
                thr.unsubscribe(self)  # itself: still told of step 1 once; the others still hear it

    class Other:
        def on_record(self, step: int, event: object, now: float) -> None:
            heard.append(("other", step))

    thr.subscribe(Early())
    thr.subscribe(Other())
    for _ in thr.wrap(range(3)):
        dev.launch(0.001)
    assert heard == [("early", 0), ("other", 0), ("early", 1), ("other", 1), ("late", 1), ("other", 2), ("late", 2)]


_NOTIFICATIONS = ("before_record", "on_record", "on_drop", "on_dry", "on_fetch", "on_batch", "on_handout",
                  "on_idle", "on_retire", "on_wait_begin", "on_wait", "on_pause")


def _every_notification(dev: FakeDevice, thr: at.Throttle, log: list[tuple[object, ...]]) -> None:
    """A wrapped loop that waits, runs dry and starves, then a dropped step: every hook is told.

    Each ValueError raised is logged as it arrives (its message only: an error kept would keep its pass alive).
    """
    try:
        for i in thr.wrap(range(4)):
            dev.launch(0.010)
            if i == 2:
                dev.host(0.050)  # step 1 completes in this body (dry); step 3 is handed out idle
    except ValueError as exc:
        log.append(("caught", str(exc)))
    try:
        with thr.step():
            raise KeyError("dropped")
    except (KeyError, ValueError) as exc:
        if isinstance(exc, ValueError):
            log.append(("caught", str(exc)))


@pytest.mark.parametrize("hook", _NOTIFICATIONS)
def test_a_part_that_raises_hides_the_notification_from_no_part_after_it(hook: str) -> None:
    """Every notification loop of the core: the parts after one that raised still hear it, then the error is
    raised (the rule for parts in Core's docstring)."""
    dev = FakeDevice()
    thr = dev.throttle(2)
    log: list[tuple[object, ...]] = []

    def raising(*args: object) -> None:
        if not log:
            log.append(("raising", *args))
            raise ValueError(f"{hook} raised")

    def listening(*args: object) -> None:
        log.append(("listening", *args))

    inside(thr).core.listen(hook, raising)
    inside(thr).core.listen(hook, listening)
    _every_notification(dev, thr, log)
    told = log[0][1:]
    # the part after it heard that notification, before the error reached the caller; it was raised once
    assert log[:3] == [("raising", *told), ("listening", *told), ("caught", f"{hook} raised")]
    assert log.count(("caught", f"{hook} raised")) == 1
