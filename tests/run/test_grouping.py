"""The report's steps: the live steps grouped by the classifier's (:mod:`asyncthrottle.run.grouping`),
on literal events (``e``: the live step ended at the event before it), and on Steps told a
loop's calls directly (the record then groups the live steps at the script's end); and the
live boundary of a rollout (a no-grad forward whose outputs the loop reads on the host)."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest
from _runs import SharedRuns
from test_classify import RECORDED, events

from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run.classify import classify
from asyncthrottle.run.grouping import Grouper, _scan, _scan_all, groups, starts
from asyncthrottle.run.record import Record, load
from asyncthrottle.run.recording import RecordingSteps
from asyncthrottle.testing import FakeClock

torch = pytest.importorskip("torch")


def live(text: str) -> list[tuple[Any, ...]]:
    """:func:`test_classify.events`, with ``e``: the live step ended (numbered in order)."""
    found: list[tuple[Any, ...]] = []
    for number, chunk in enumerate(text.split(" e")):
        found += events(chunk)
        if number < text.count(" e"):
            found.append(("ended", 0.0, number, 1.0, 0.0))
    return found


GROUPED = [
    ("one live step a step", "m0 L F B O0 o L e F B O0 o L e", [0, 1]),
    # the first pass's update heard only as its parameters moved: a live step of its own
    ("SAM's first batch", "m0 L F B F e B O0 o L e F B F B O0 o L e", [0, 0, 1]),
    ("three models on one batch", "m0 m1 m2" + " L F B O0 o F e B O1 o F e B O2 o L e" * 2,
     [0, 0, 0, 1, 1, 1]),
    ("a WGAN's generator update, no loader",
     "m0 m1 F B O0 o F e B O0 o F e F B O1 o F e B O0 o F e", [0, 1, 1, 2]),
    # a live step holding the updates of two of the classifier's steps makes them one
    ("a live step over two batches", "m0 L F B O0 o L F B O0 o L e F B O0 o L e", [0, 1]),
    ("a live step over two steps, merged with its neighbours",
     "m0 m1 L F B O0 o F e B O1 o L F B O0 o F e B O1 o L e", [0, 0, 0]),
    # a batch taken between an update-less live step and the next: not lent to it
    ("an update-less live step before a batch", "m0 F B F e L F B O0 o L e", [0, 1]),
    # (each backward() an update, the next one ending its live step; model.eval() the last)
    ("manual SGD", "F B F B e F B e E e", [0, 1, 2]),
]


@pytest.mark.parametrize(("shape", "text", "expected"), GROUPED, ids=[g[0] for g in GROUPED])
def test_live_steps_are_grouped_by_the_classifier_s_steps(shape: str, text: str,
                                                           expected: list[int]) -> None:
    assert groups(live(text)) == expected


def test_a_record_with_nothing_to_group_by_keeps_the_live_steps() -> None:
    # no live step ended; no update the classifier knows (a compiled optimizer: none heard);
    # live steps not numbered from 0 (a record that lost its beginning)
    assert groups(live("m0 L F B O0 o")) == []
    assert groups(live("m0 L F B L e F B L e")) == []
    assert groups([*events("m0 L F B O0 o"), ("ended", 0.0, 3, 1.0, 0.0)]) == []


def _grown(found: list[tuple[Any, ...]], size: int) -> tuple[bytearray, int]:
    """``found`` told to a record one by one, grouped as it grows (a window of ``size``
    events): each live step's byte, and the most events the record held."""
    record = Record(lambda: 0.0)
    grouper = Grouper(record, size=size)
    most = 0
    for event in found:
        record.add(event[0], *event[2:])
        if event[0] == "ended":
            grouper.grow()
        most = max(most, len(record.events))
    return grouper.starts_all(), most


@pytest.mark.parametrize(("shape", "text", "expected"), GROUPED, ids=[g[0] for g in GROUPED])
def test_a_record_grouped_as_it_grows_is_grouped_as_a_whole(shape: str, text: str,
                                                            expected: list[int]) -> None:
    """Ten times the shape, grouped in windows of a few events (each dropped up to where no
    rule's answer can change): the report steps of the whole record."""
    found = live(" ".join([text] + [
        " ".join(word for word in text.split() if not word.startswith("m"))] * 9))
    whole = starts(found)
    assert len(whole) == 10 * len(expected)
    grown, most = _grown(found, size=8)
    assert grown == whole
    assert most < len(found) / 2


def test_a_long_loop_s_record_keeps_a_window_of_a_few_steps() -> None:
    """A GAN with no loader, 2,000 steps: grouped as the record grows, it holds some steps'
    events, not the run's; its two live steps a step (the live finder's cut at the generator's
    forward) are one report step each."""
    found = live("m0 m1" + " F B O0 o F e B O1 o F e" * 2000)
    grown, most = _grown(found, size=64)
    assert grown == bytes([1, 0]) * 2000
    assert most < 200


@pytest.mark.parametrize(("text", "steps"), [
    ("m0" + " L F B O0 o L e F B O0 o L e F B O0 o L e" * 700, 2100),
    ("m0" + " F B O0 o F e B O0 o F e B O0 o F e" * 700, 2100),
    ("F B F B e" + " F B e" * 2000, 2001),
])
def test_the_usual_loop_s_record_holds_two_live_steps_at_a_time(text: str, steps: int) -> None:
    """One update a live step, the next one's the same optimizer's (or a batch between): each
    live step is one report step as the next one ends, without the classifier, whatever the
    window (here never reached)."""
    grown, most = _grown(live(text), size=10**9)
    assert grown == bytes([1]) * steps
    assert most < 20


def _event(kind: str, number: int, token: int) -> tuple[Any, ...]:
    return {"step": ("step", 0.0, number % 2, token), "step_end": ("step_end", 0.0, token),
            "made": ("made", 0.0, 5), "dropped": ("dropped", 0.0, 1)}.get(kind, (kind, 0.0))


def test_a_live_step_is_read_by_its_plan_as_an_event_at_a_time() -> None:
    """A live step's summary by the plan of its kinds of events (the usual loop's, no loop in
    Python) is the general scan's, for every live step of up to four events of these kinds,
    its optimizer step's end paired to its frame or not, anywhere in the record."""
    kinds = ["forward", "backward", "step", "step_end", "fetch", "made", "dropped", "read"]
    planned = 0
    for length in range(5):
        for shape in itertools.product(kinds, repeat=length):
            for paired in (True, False):
                found = [("forward", 0.0)] * 2 + [
                    _event(kind, k, 7 if paired or kind == "step" else 8)
                    for k, kind in enumerate(shape)] + [("forward", 0.0)]
                for offset in (0, 10):
                    read = _scan(found, 2, len(found) - 1, offset)
                    assert read == _scan_all(found, 2, len(found) - 1, offset), (shape, paired)
                    assert type(read).__name__ == "_Live"
                    planned += "made" not in shape and "dropped" not in shape
    assert planned > 1000


def test_live_steps_not_numbered_from_0_are_not_grouped_and_their_record_is_dropped() -> None:
    """(a throttle that numbers its steps otherwise: each live step is a report step)"""
    found = [("ended", 0.0, event[2] + 1, 1.0, 0.0) if event[0] == "ended" else event
             for event in live("m0" + " L F B O0 o F e B O1 o L e" * 500)]
    grown, most = _grown(found, size=64)
    assert grown == b"" and most < 20


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", RECORDED)
def test_a_real_record_grouped_as_it_grows_is_grouped_as_a_whole(
        script: str, shared_runs: SharedRuns) -> None:
    """The record of a script's shared run (``run --events``, the run test_classify.py reads)."""
    done, _, folder = shared_runs.run(script, "{folder}/run.txt")
    assert done.returncode == 0, done.stderr.decode()
    _, recorded, _ = load((folder / "events.jsonl").read_text())
    assert _grown(recorded, size=16)[0] == starts(recorded)
    # the live steps are a refinement of the classifier's (the grouping joins, never splits):
    # as many report steps as the classifier finds
    assert sum(starts(recorded)) == len(classify(recorded))


class Optimizer:
    def __init__(self) -> None:
        self.param_groups = [{"params": [torch.zeros(1)]}]


def _recording() -> tuple[RecordingSteps, FakeClock]:
    clock = FakeClock()
    steps = RecordingSteps(lambda device: ThrottleHooks(None, device="cpu", clock=clock, trace=0,
                                                        nonfinite=None),
                           record=Record(clock), clock=clock)
    return steps, clock


def _update(steps: RecordingSteps, optimizer: Any) -> None:
    frame = sys._getframe()
    steps.optimizer_begin(optimizer, frame)
    steps.optimizer_end(frame)


def _pass(steps: RecordingSteps, clock: FakeClock, loss: float, site: Any,
          grad: bool = True) -> None:
    steps.forward(grad, None, site)
    clock.advance(1.0)
    steps.backward(torch.tensor(loss))
    steps.after_backward()


def test_three_models_on_one_batch_are_one_report_step_with_each_one_s_loss() -> None:
    """The live finder makes each model's update a step; the report groups the three (their
    losses summed, their times and input waits too; each optimizer keeps its own series)."""
    steps, clock = _recording()
    opts = [Optimizer() for _ in range(3)]
    for opt in opts:
        steps.optimizers.made(opt)
    for batch in range(2):
        steps.fetch_begin()
        start = clock()
        clock.advance(0.5)
        steps.fetch_end(start, 0.5, False, {"num_workers": 0})
        for k, opt in enumerate(opts):
            _pass(steps, clock, 10.0 * batch + k, ("train.py", 20))
            _update(steps, opt)
    steps.finish()
    runner = steps.runner
    assert runner is not None
    assert runner.live == 6 and runner.steps == 2
    assert runner.series() == [0.0 + 1.0 + 2.0, 10.0 + 11.0 + 12.0]
    timed = runner.per_step()
    assert timed is not None
    assert timed["step_s"] == pytest.approx([3.0, 3.0])
    # (the first batch starts the loop's pass: its wait is not the loop's)
    assert timed["input_wait_s"] == pytest.approx([0.0, 0.5])
    assert list(runner.by_optimizer().values()) == [[0.0, 10.0], [1.0, 11.0], [2.0, 12.0]]


def test_a_rollout_s_forwards_and_reads_are_no_step_s_time() -> None:
    """PPO with no loader: after the updates, forwards without grad whose outputs the loop reads
    (its actions) pause the loop there; the next training forward opens the step (its time
    holds none of the rollout's)."""
    steps, clock = _recording()
    opt = Optimizer()
    steps.optimizers.made(opt)
    rollout, train = ("ppo.py", 20), ("ppo.py", 40)
    for _ in range(2):
        for _ in range(4):
            steps.forward(False, None, rollout)
            steps.read("Tensor.item", ("ppo.py", 21, None))
            clock.advance(3.0)
        for k in range(2):
            _pass(steps, clock, float(k), train)
            _update(steps, opt)
            # (the forward hook re-armed after the update hears the next forward)
    steps.finish()
    runner = steps.runner
    assert runner is not None and runner.steps == 4
    timed = runner.per_step()
    assert timed is not None and timed["step_s"] == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert runner.hooks.throttle.stats.wall_s == pytest.approx(4.0)


def test_a_teacher_s_forward_with_no_read_still_begins_its_step() -> None:
    """Distillation with no loader: the teacher's no-grad forward is read by nothing on the host:
    the step began there (its time is the step's)."""
    steps, clock = _recording()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(3):
        steps.forward(False, None, ("distill.py", 10))
        clock.advance(3.0)
        _pass(steps, clock, float(k), ("distill.py", 12))
        _update(steps, opt)
    steps.finish()
    runner = steps.runner
    assert runner is not None and runner.series() == [0.0, 1.0, 2.0]
    timed = runner.per_step()
    # the first step opens at its training forward (no step before it to end)
    assert timed is not None and timed["step_s"] == pytest.approx([1.0, 4.0, 4.0])
