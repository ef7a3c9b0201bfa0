"""The step rules of ``run`` told directly (no script, no subprocess): what Steps makes of a GAN's
two optimizers, a caught error in ``optimizer.step()``, a batch's work before its forward, an
evaluation with grad on, and an epoch's end."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run.steps import Steps
from asyncthrottle.testing import FakeClock, FakeDevice

torch = pytest.importorskip("torch")

TRAIN, ELSEWHERE = ("train.py", 10), ("train.py", 30)


class Optimizer:
    def __init__(self) -> None:
        self.param_groups = [{"params": [torch.zeros(1)]}]


def _steps() -> tuple[Steps, FakeClock]:
    clock = FakeClock()
    steps = Steps(lambda device: ThrottleHooks(None, device=device, clock=clock, trace=0,
                                               nonfinite=None), clock=clock)
    return steps, clock


def _update(steps: Steps, optimizer: Any) -> None:
    frame = sys._getframe()
    steps.optimizer_begin(optimizer, frame)
    steps.optimizer_end(frame)


def _raising_update(steps: Steps, optimizer: Any) -> None:
    # optimizer.step() raised: its post hook never ran, and its frame is gone
    steps.optimizer_begin(optimizer, sys._getframe())


def _batch(steps: Steps, clock: FakeClock, seconds: float = 0.0) -> None:
    steps.fetch_begin()
    start = clock()
    clock.advance(seconds)
    steps.fetch_end(start, seconds, False, {"num_workers": 0})


def _train(steps: Steps, optimizer: Any, loss: float, site: Any = TRAIN) -> None:
    steps.forward(True, None, site)
    steps.backward(torch.tensor(loss))
    steps.after_backward()
    _update(steps, optimizer)


def _losses(steps: Steps) -> list[float | None]:
    steps.finish()
    assert steps.runner is not None
    return steps.runner.series()


def test_a_gan_batch_with_two_optimizers_is_one_step_with_each_optimizer_s_loss() -> None:
    steps, clock = _steps()
    d, g = Optimizer(), Optimizer()
    steps.optimizers.made(d)
    steps.optimizers.made(g)
    for k in range(3):
        _batch(steps, clock)
        _train(steps, d, 1.0 + k)
        _train(steps, g, 10.0 + k, site=("train.py", 20))
    assert _losses(steps) == [11.0, 13.0, 15.0]
    assert steps.runner is not None
    assert steps.runner.by_optimizer() == {"optimizer 0 (Optimizer)": [1.0, 2.0, 3.0],
                                          "optimizer 1 (Optimizer)": [10.0, 11.0, 12.0]}


def test_without_a_loader_a_gan_s_steps_end_once_both_optimizers_stepped() -> None:
    steps, _ = _steps()
    d, g = Optimizer(), Optimizer()
    steps.optimizers.made(d)
    steps.optimizers.made(g)
    for k in range(3):
        _train(steps, d, 1.0 + k)
        _train(steps, g, 10.0 + k, site=("train.py", 20))
    assert _losses(steps) == [11.0, 13.0, 15.0]


def test_an_optimizer_made_but_never_stepped_holds_no_step_open_after_the_first() -> None:
    steps, _ = _steps()
    used, unused = Optimizer(), Optimizer()
    steps.optimizers.made(used)
    steps.optimizers.made(unused)
    for k in range(4):
        _train(steps, used, float(k))
    assert _losses(steps) == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("loader", [True, False])
def test_a_caught_error_in_optimizer_step_drops_that_batch_and_detection_goes_on(
        loader: bool) -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(5):
        if loader:
            _batch(steps, clock)
        steps.forward(True, None, TRAIN)
        steps.backward(torch.tensor(float(k)))
        steps.after_backward()
        (_raising_update if k == 2 else _update)(steps, opt)
    assert _losses(steps) == [0.0, 1.0, 3.0, 4.0]


def test_a_batch_s_work_before_its_forward_is_the_step_s_and_its_wait_the_input_wait() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(4):
        _batch(steps, clock, seconds=0.001)
        # preprocessing: body time, not the loader's
        clock.advance(0.002)
        _train(steps, opt, float(k))
    _losses(steps)
    assert steps.runner is not None
    stats = steps.runner.hooks.throttle.stats
    # the first batch is taken before any step (not loop time: its step opens at its forward);
    # the next three are the loop's wait, and their preprocessing their steps' time
    assert steps.input_wait == pytest.approx(0.003)
    assert stats.fetch_s == pytest.approx(0.003) and stats.body_s == pytest.approx(0.006)


def test_a_forward_with_grad_elsewhere_than_the_steps_opens_no_step() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(4):
        _batch(steps, clock)
        _train(steps, opt, float(k))
        # an evaluation without no_grad or eval(): a forward, no backward
        steps.forward(True, None, ELSEWHERE)
        clock.advance(1.0)
    assert _losses(steps) == [0.0, 1.0, 2.0, 3.0]
    assert steps.runner is not None
    # the evaluations' seconds are not the loop's
    assert steps.runner.hooks.throttle.stats.wall_s < 1.0


def test_an_epoch_s_last_next_is_neither_input_wait_nor_loop_time() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(3):
        _batch(steps, clock)
        _train(steps, opt, float(k))
    steps.fetch_begin()
    start = clock()
    # joining the workers
    clock.advance(5.0)
    steps.fetch_end(start, 5.0, True, {"num_workers": 2})
    _losses(steps)
    assert steps.runner is not None
    assert steps.input_wait == 0.0
    assert steps.runner.hooks.throttle.stats.wall_s < 1.0


def test_a_teacher_s_forward_without_grad_inside_a_step_is_the_step_s() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(3):
        _batch(steps, clock)
        # the teacher, under no_grad, before the student's forward
        steps.forward(False, None, ("train.py", 5))
        _train(steps, opt, float(k))
    assert _losses(steps) == [0.0, 1.0, 2.0]


TEACHER = ("train.py", 5)


def _train_after_teacher(steps: Steps, clock: FakeClock, opt: Any, loss: float) -> None:
    """A step with no loader: the teacher's forward under no_grad (the runner's forward hook then
    stands down, so the student's forward goes unheard), 2 s of forwards, backward and update."""
    steps.forward(False, None, TEACHER)
    clock.advance(2.0)
    steps.backward(torch.tensor(loss))
    steps.after_backward()
    clock.advance(0.5)
    _update(steps, opt)


def test_without_a_loader_a_teacher_s_forward_without_grad_begins_the_step_it_trains_in() -> None:
    """Distillation, or a target network's forward (reinforcement learning), over batches the loop
    makes itself: the time from the no-grad forward is the step's, and the loop's."""
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(4):
        _train_after_teacher(steps, clock, opt, float(k))
    assert _losses(steps) == [0.0, 1.0, 2.0, 3.0]
    assert steps.runner is not None
    timed = steps.runner.per_step()
    # the first step opens at its backward (a no-grad forward before any training is no step's)
    assert timed is not None and timed["step_s"] == pytest.approx([0.5, 2.5, 2.5, 2.5])
    assert steps.runner.hooks.throttle.stats.wall_s == pytest.approx(8.0)


@pytest.mark.parametrize("ends", ["script", "eval()", "a later step"])
def test_without_a_loader_an_evaluation_without_grad_after_training_is_not_loop_time(ends: str) -> None:
    """A no-grad forward after the last update, then 5 s of evaluation: not the loop's time when the
    script ends or calls ``model.eval()``; when a step trains after it instead, it was that step's."""
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(2):
        _train_after_teacher(steps, clock, opt, float(k))
    steps.forward(False, None, ELSEWHERE)
    clock.advance(5.0)
    if ends == "eval()":
        steps.leave()
        clock.advance(1.0)
    elif ends == "a later step":
        steps.backward(torch.tensor(9.0))
        steps.after_backward()
        _update(steps, opt)
    _losses(steps)
    assert steps.runner is not None
    wall = steps.runner.hooks.throttle.stats.wall_s
    assert wall == pytest.approx(3.0 + (5.0 if ends == "a later step" else 0.0))


def test_an_evaluation_without_grad_between_epochs_is_no_step_and_not_loop_time() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for _epoch in range(2):
        for k in range(3):
            _batch(steps, clock)
            _train(steps, opt, float(k))
        for _ in range(4):
            _batch(steps, clock, seconds=0.5)
            steps.forward(False, None, ELSEWHERE)
            clock.advance(1.0)
    assert _losses(steps) == [0.0, 1.0, 2.0] * 2
    assert steps.runner is not None
    # of the evaluation, only its first batch's wait (0.5 s each time) is loop time: it is taken
    # before anything says it is no step's; its forwards (4 s each time) are not
    assert steps.runner.hooks.throttle.stats.wall_s == pytest.approx(1.0)
    assert steps.input_wait == 0.0


def test_each_step_s_host_time_and_input_wait_are_kept_by_step_and_a_dropped_batch_has_none(
        ) -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(4):
        _batch(steps, clock, seconds=0.001 * (k + 1))
        clock.advance(0.01 * (k + 1))
        if k == 2:
            # a batch whose optimizer step raised: no step, and no time kept for it
            steps.forward(True, None, TRAIN)
            steps.backward(torch.tensor(1.0))
            steps.after_backward()
            _raising_update(steps, opt)
            continue
        _train(steps, opt, float(k))
    _losses(steps)
    assert steps.runner is not None
    timed = steps.runner.per_step()
    assert timed is not None
    # the first batch is taken before any step, and so is the one after the dropped batch (the
    # loop paused there): their steps open at their forwards, with no wait
    assert timed["step_s"] == pytest.approx([0.0, 0.02, 0.0])
    assert timed["input_wait_s"] == pytest.approx([0.0, 0.002, 0.0])
    assert sum(timed["input_wait_s"]) == pytest.approx(steps.input_wait)


class Trainable:
    """An optimizer of one trainable parameter (and a frozen one first, which no step moves)."""

    def __init__(self) -> None:
        self.param_groups = [{"params": [torch.zeros(1), torch.zeros(1, requires_grad=True)]}]

    def compiled_step(self) -> None:
        # a step torch.compile runs: no hook hears it; the parameters change in place
        with torch.no_grad():
            self.param_groups[0]["params"][1].add_(1.0)


def _train_compiled(steps: Steps, optimizer: Trainable, loss: float,
                    update: bool = True) -> None:
    steps.forward(True, None, TRAIN)
    steps.backward(torch.tensor(loss))
    steps.after_backward()
    if update:
        optimizer.compiled_step()


def test_an_optimizer_step_no_hook_hears_is_found_by_its_parameters_changing() -> None:
    """torch.compile(opt.step) calls no optimizer hook: the next forward where the steps begin
    ends the step all the same, and the script's last step ends at its end."""
    steps, _ = _steps()
    opt = Trainable()
    steps.optimizers.made(opt)
    for k in range(4):
        _train_compiled(steps, opt, 1.0 + k)
    assert _losses(steps) == [1.0, 2.0, 3.0, 4.0]
    assert steps.optimizers.unheard is True


def test_unheard_optimizer_steps_with_gradient_accumulation_over_a_loader() -> None:
    """Two batches a step: a batch whose backward moved no parameter goes on accumulating."""
    steps, clock = _steps()
    opt = Trainable()
    steps.optimizers.made(opt)
    for k in range(8):
        _batch(steps, clock)
        _train_compiled(steps, opt, 1.0 + k, update=k % 2 == 1)
    assert _losses(steps) == [3.0, 7.0, 11.0, 15.0]


def test_backward_without_any_update_is_still_no_step() -> None:
    steps, clock = _steps()
    opt = Trainable()
    steps.optimizers.made(opt)
    for k in range(3):
        _batch(steps, clock)
        _train_compiled(steps, opt, 1.0 + k, update=False)
    assert _losses(steps) == []


def test_once_an_optimizer_step_is_heard_the_parameters_are_never_looked_at_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    steps, clock = _steps()
    opt = Trainable()
    steps.optimizers.made(opt)
    looked = []
    versions = steps.optimizers.versions
    monkeypatch.setattr(steps.optimizers, "versions", lambda: looked.append(1) or versions())
    for k in range(6):
        _batch(steps, clock)
        # gradient accumulation, heard: two batches a step
        steps.forward(True, None, TRAIN)
        steps.backward(torch.tensor(1.0 + k))
        steps.after_backward()
        if k % 2 == 1:
            _update(steps, opt)
        if k == 1:
            # the first step's stamp and its second batch's looks, before a step was heard
            before = len(looked)
            assert before > 0 and steps.optimizers.unheard is False
    assert _losses(steps) == [3.0, 7.0, 11.0]
    assert len(looked) == before


@pytest.mark.parametrize("device", ["synchronous", "fake events"])
def test_a_second_optimizer_in_a_later_loop_keeps_the_first_one_s_losses(device: str) -> None:
    """Pre-training with one optimizer, then fine-tuning with a new one (another loop, another
    line): each one's series holds its own steps, the first one's from before the second was
    known too (kept then as the step's loss)."""
    if device == "synchronous":
        steps, _ = _steps()
    else:
        fake = FakeDevice()
        steps = Steps(lambda _: ThrottleHooks(2, events=fake.event, clock=fake.clock, trace=0,
                                              nonfinite=None), clock=fake.clock)
    first, second = Optimizer(), Optimizer()
    steps.optimizers.made(first)
    for k in range(3):
        _train(steps, first, 1.0 + k)
    steps.optimizers.made(second)
    for k in range(4):
        _train(steps, second, 10.0 + k, site=ELSEWHERE)
    assert _losses(steps) == [1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]
    assert steps.runner is not None
    assert steps.runner.by_optimizer() == {
        "optimizer 0 (Optimizer)": [1.0, 2.0, 3.0, None, None, None, None],
        "optimizer 1 (Optimizer)": [None, None, None, 10.0, 11.0, 12.0, 13.0]}


def test_an_optimizer_made_again_over_the_same_parameters_keeps_its_place() -> None:
    """Made anew each epoch (same class, same parameters): one optimizer, named once; another class,
    or other parameters, is another optimizer."""
    steps, _ = _steps()
    first = Optimizer()
    params = first.param_groups[0]["params"]
    again, other = Optimizer(), Optimizer()
    again.param_groups = [{"params": list(params)}]

    class SGD(Optimizer):
        pass

    same_params_other_class = SGD()
    same_params_other_class.param_groups = [{"params": list(params)}]
    for optimizer in (first, again, other, same_params_other_class):
        steps.optimizers.made(optimizer)
        _train(steps, optimizer, 1.0)
    steps.finish()
    assert steps.runner is not None
    assert steps.runner.names == ["optimizer 0 (Optimizer)", "optimizer 1 (Optimizer)",
                                  "optimizer 2 (SGD)"]
    assert [steps.optimizers.positions[id(o)] for o in (first, again, other, same_params_other_class)] == [
        0, 0, 1, 2]


G_SITE, EVAL_SITE = ("train.py", 40), ("train.py", 50)


def test_a_wgan_s_generator_update_every_third_batch_is_that_batch_s_step() -> None:
    """n_critic: the critic steps every batch, the generator every third, in the same batch and
    after the critic's update (a forward elsewhere once the batch's step is complete)."""
    steps, clock = _steps()
    critic, generator = Optimizer(), Optimizer()
    steps.optimizers.made(critic)
    steps.optimizers.made(generator)
    for k in range(9):
        _batch(steps, clock)
        _train(steps, critic, 1.0 + k)
        if k % 3 == 0:
            _train(steps, generator, 100.0 + k, site=G_SITE)
    assert _losses(steps) == [101.0 + 2 * k if k % 3 == 0 else 1.0 + k for k in range(9)]
    assert steps.runner is not None
    assert steps.runner.by_optimizer()["optimizer 1 (Optimizer)"] == [
        100.0 + k if k % 3 == 0 else None for k in range(9)]


def test_an_evaluation_with_grad_after_a_batch_s_update_is_not_the_step_s_time() -> None:
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(4):
        _batch(steps, clock)
        _train(steps, opt, 1.0 + k)
        clock.advance(0.01)
        if k == 1:
            # an evaluation's forward (grad on, no backward after it): 5 s that are no step's
            steps.forward(True, None, EVAL_SITE)
            clock.advance(5.0)
    assert _losses(steps) == [1.0, 2.0, 3.0, 4.0]
    assert steps.runner is not None
    timed = steps.runner.per_step()
    assert timed is not None and timed["step_s"] == pytest.approx([0.01] * 4)
    assert steps.runner.hooks.throttle.stats.wall_s == pytest.approx(0.04)


TASK_A, TASK_B, CHILD = ("train.py", 20), ("train.py", 22), ("model.py", 8)


def test_without_a_loader_steps_whose_forwards_alternate_between_two_lines_begin_at_them() -> None:
    """Two tasks trained in turn, each forward at its own line (no loader): the second line's
    first forward is one elsewhere (an evaluation, until it trains); its ``backward()`` makes the
    step begin back at that forward, and its line then opens steps as the first does."""
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(6):
        steps.forward(True, None, TASK_A if k % 2 == 0 else TASK_B)
        # the model's own modules, heard while the hook stays armed
        steps.forward(True, None, CHILD)
        clock.advance(2.0)
        steps.backward(torch.tensor(float(k)))
        steps.after_backward()
        clock.advance(0.5)
        _update(steps, opt)
    assert _losses(steps) == [float(k) for k in range(6)]
    assert steps.runner is not None
    timed = steps.runner.per_step()
    assert timed is not None and timed["step_s"] == pytest.approx([2.5] * 6)
    assert steps.runner.hooks.throttle.stats.wall_s == pytest.approx(15.0)
    assert steps.openers == {TASK_A, TASK_B}


@pytest.mark.parametrize("ends", ["a forward where steps begin", "eval()", "a batch", "script"])
def test_without_a_loader_an_evaluation_with_grad_after_a_step_is_not_loop_time(ends: str) -> None:
    """A forward with grad at another line after the last update, and 5 s of its evaluation
    (more forwards, its modules'): not the loop's time, however it ends."""
    steps, clock = _steps()
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(2):
        _train(steps, opt, float(k))
        clock.advance(1.0)
    for _ in range(3):
        steps.forward(True, None, ELSEWHERE)
        steps.forward(True, None, CHILD)
        clock.advance(5.0 / 3)
    if ends == "a forward where steps begin":
        _train(steps, opt, 2.0)
        clock.advance(1.0)
    elif ends == "eval()":
        steps.leave()
    elif ends == "a batch":
        _batch(steps, clock, seconds=0.25)
        _train(steps, opt, 2.0)
        clock.advance(1.0)
    _losses(steps)
    assert steps.runner is not None
    assert ELSEWHERE not in steps.openers
    trained = 2 if ends in ("eval()", "script") else 3
    # each step 1 s, from its forward to the next one's (the last to the evaluation's first
    # forward, or to its end); the first batch after the evaluation is taken while paused, as
    # after model.eval()
    assert steps.runner.hooks.throttle.stats.wall_s == pytest.approx(trained)
