"""The classifier's rules on literal events, one loop shape a line (``"L F B O0 o | L F B O0 o"``:
two steps), and on the records of real scripts (``run --events``): the steps and losses each
script counts itself, the shapes the live step finder misreads included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _runs import SharedRuns

from asyncthrottle.run.classify import classify
from asyncthrottle.run.record import load


def events(text: str) -> list[tuple[Any, ...]]:
    """Literal events: ``L`` a batch, ``F``/``f`` a forward with grad or without, ``B`` a
    ``backward()`` of loss 1 (``B2.5``: of 2.5, ``B?``: of no scalar), ``O<k>`` optimizer k's step
    begins and ``o`` the innermost running one ends, ``d`` the runner's answer that the innermost
    running one raised (its frame gone), ``m<k>`` optimizer k made, ``E`` ``model.eval()``, ``r``
    a read; ``|`` separates nothing (for the eye)."""
    found: list[tuple[Any, ...]] = []
    running: list[int] = []
    frames = 0
    for word in text.split():
        head, rest = word[0], word[1:]
        if head == "|":
            continue
        if head == "O":
            frames += 1
            running.append(frames)
            found.append(("step", 0.0, int(rest), frames))
        elif head == "o":
            found.append(("step_end", 0.0, running.pop()))
        elif head == "d":
            running.pop()
            found.append(("dropped", 0.0, 1))
        elif head == "B":
            found.append(("backward", 0.0, None if rest == "?" else float(rest or 1.0)))
        else:
            found.append({"L": ("fetch", 0.0), "F": ("forward", 0.0, True, None),
                          "f": ("forward", 0.0, False, None), "E": ("eval", 0.0),
                          "r": ("read", 0.0, "Tensor.item", "t.py", 1, None),
                          "m": ("made", 0.0, int(rest or 0))}[head])
    return found


def _count(text: str) -> int:
    return len(classify(events(text)))


def _losses(text: str) -> list[float | None]:
    return [step.loss for step in classify(events(text))]


# (the shape, its events, its steps)
SHAPES = [
    ("a loader, one optimizer", "m0 L F B O0 o | L F B O0 o", 2),
    ("no loader", "m0 F B O0 o | F B O0 o | F B O0 o", 3),
    ("manual SGD, no optimizer", "F B | F B | F B | F B", 4),
    ("a GAN over a loader", "m0 m1" + " L F B O0 o F B O1 o" * 3, 3),
    ("a GAN, no loader", "m0 m1" + " F B O0 o F B O1 o" * 3, 3),
    ("a GAN's one batch", "m0 m1 F B O0 o F B O1 o", 1),
    ("an optimizer made, never stepped", "m0 m1" + " F B O0 o" * 4, 4),
    ("SAM over a loader", "m0" + " L F B F B O0 o" * 16, 16),
    ("SAM, no loader", "m0" + " F B F B O0 o" * 12, 12),
    ("a WGAN, no loader: the generator every 4th", "m0 m1" + (" F B O0 o" * 3
                                                               + " F B O0 o F B O1 o") * 3, 12),
    ("three models, a loader", "m0 m1 m2" + " L F B O0 o F B O1 o F B O2 o" * 10, 10),
    ("three models, no loader", "m0 m1 m2" + " F B O0 o F B O1 o F B O2 o" * 10, 10),
    ("PPO: a rollout, then minibatch updates", "m0" + (" f r" * 16 + " F B O0 o r" * 8) * 3, 24),
    ("REINFORCE: an episode, one update", "m0" + (" F" * 10 + " B O0 o") * 6, 6),
    ("DQN with a target network", "m0" + " F f B O0 o" * 15, 15),
    ("truncated BPTT: updates a batch", "m0" + (" L" + " F B O0 o" * 3) * 4, 12),
    ("two views a batch", "m0" + " L F F B O0 o" * 8, 8),
    ("two losses, retain_graph", "m0" + " F B B O0 o" * 6, 6),
    ("MAML: inner forwards, one meta-update", "m0" + " F F F F F F B O0 o" * 5, 5),
    ("accumulation by hand", "m0" + " F B F B F B F B O0 o" * 6, 6),
    ("accumulation over a loader", "m0" + " L F B L F B O0 o" * 4, 4),
    ("LBFGS: closures inside step()", "m0" + " O0 F B F B o" * 3, 3),
    ("GradScaler: optimizer.step() inside scaler.step()", "m0" + " F B O0 O0 o o" * 5, 5),
    ("a caught error in step()", "m0 L F B O0 | L d F B O0 o | L F B O0 o", 2),
    ("fine-tuning: a new optimizer later", "m0 F B O0 o F B O0 o m1 F B O1 o F B O1 o", 4),
    ("both made first, one after the other", "m0 m1 F B O0 o F B O0 o F B O1 o F B O1 o", 4),
    ("an evaluation between epochs", "m0 L F B O0 o L F B O0 o E L f L f L F B O0 o", 3),
]


@pytest.mark.parametrize(("shape", "text", "steps"), SHAPES, ids=[s[0] for s in SHAPES])
def test_each_shape_s_steps(shape: str, text: str, steps: int) -> None:
    assert _count(text) == steps


def test_a_step_s_loss_is_its_backward_calls_and_each_optimizer_s_its_own() -> None:
    assert _losses("m0 F B1 F B2 O0 o | F B3 O0 o") == [3.0, 3.0]
    assert _losses("F B1 | F B? | F B2") == [1.0, None, 2.0]
    gan = classify(events("m0 m1 L F B1 O0 o F B10 O1 o | L F B2 O0 o F B20 O1 o"))
    assert [step.loss for step in gan] == [11.0, 22.0]
    assert [step.by_optimizer for step in gan] == [{0: 1.0, 1: 10.0}, {0: 2.0, 1: 20.0}]


def test_a_closure_s_first_loss_is_its_step_s_and_a_dropped_step_s_loss_goes_with_it() -> None:
    assert _losses("m0 O0 F B4 F B5 o O0 F B6 o") == [4.0, 6.0]
    assert _losses("m0 L F B1 O0 | L d F B2 O0 o") == [2.0]


def test_a_rule_decides_only_where_the_rules_before_it_had_no_opinion() -> None:
    """Without the rules, every update is a step of its own; the first rule with an opinion
    decides."""
    gan = events("m0 m1" + " F B O0 o F B O1 o" * 3)
    assert len(classify(gan, rules=())) == 6
    assert len(classify(gan, rules=(lambda context, step, update: True,))) == 1


# the scripts (tests/run/scripts) whose records the classifier reads, and the steps each counts
RECORDED = ["sam_loader.py", "sam_no_loader.py", "wgan_no_loader.py", "three_models.py",
            "ppo.py", "reinforce.py", "dqn_target.py", "tbptt.py", "two_views.py",
            "retain_graph.py", "maml.py", "accumulate_by_hand.py", "gan.py", "accumulation.py",
            "caught_step_error.py", "lbfgs.py", "grad_scaler.py", "manual_sgd.py",
            "optimizer_per_epoch.py", "finetune.py", "eval_with_grad.py", "distill_no_loader.py"]


def _kept(script: str, value: Any) -> list[float]:
    """A script's own losses by step: a GAN's the sum of its two series a step, fine-tuning's
    the one series after the other."""
    if script == "finetune.py":
        return [float(v) for series in value.values() for v in series]
    if isinstance(value, dict):
        return [sum(each) for each in zip(*value.values(), strict=True)]
    return [float(v) for v in value]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", RECORDED)
def test_the_classifier_finds_a_script_s_own_steps_and_losses_in_its_record(
        script: str, shared_runs: SharedRuns) -> None:
    """The script's record from a real run (``run --events``, the run test_steps.py and
    test_shapes.py read too): the steps and step losses the script counts itself."""
    pytest.importorskip("torch")
    done, _, folder = shared_runs.run(script, "{folder}/run.txt")
    assert done.returncode == 0, done.stderr.decode()
    kept = _kept(script, json.loads((folder / "run.txt").read_text()))
    record = folder / "events.jsonl"
    _, recorded, _ = load(record.read_text())
    found = classify(recorded)
    assert len(found) == len(kept)
    assert [step.loss for step in found] == pytest.approx(kept, rel=1e-5, abs=1e-7, nan_ok=True)
