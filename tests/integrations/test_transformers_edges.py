"""ThrottleCallback at the HF Trainer's edges (CPU, fake device events): the Trainer's loss, drains, failures."""

from __future__ import annotations

import inspect
import pickle
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
att = pytest.importorskip("asyncthrottle.transformers")

from test_transformers import DEVICE_S, EPOCHS, SAMPLES, Probe, Tiny, _args, _callback, _data, _train  # noqa: E402

from asyncthrottle.parts.syncaudit import SyncAdvice  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402


class Normalizing(Tiny):
    """Accepts loss kwargs (like a causal LM): with ``num_items_in_batch`` its loss is over the whole step."""

    def forward(self, x: Any, labels: Any = None, **kwargs: Any) -> dict[str, Any]:
        out = super().forward(x, labels)
        items = kwargs.get("num_items_in_batch")
        if labels is not None and items is not None:
            out["loss"] = ((out["logits"] - labels) ** 2).sum() / items
        return out


def _trainer(cb: Any, dev: FakeDevice, tmp_path: Path, model: Tiny, **options: Any) -> Any:
    return transformers.Trainer(model=model, args=_args(tmp_path, **options), train_dataset=_data(),
                                eval_dataset=_data(8), callbacks=[cb, Probe(dev, cb)])


@pytest.mark.parametrize("model_class", [Tiny, Normalizing])
def test_each_steps_loss_is_the_one_the_trainer_logs(model_class: type[Tiny], tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    seen: list[float] = []
    cb.throttle.on_complete(lambda step, values: seen.append(float(values["loss"])))
    trainer = _trainer(cb, dev, tmp_path, model_class(dev), gradient_accumulation_steps=4, num_train_epochs=2,
                       eval_strategy="no", logging_strategy="steps", logging_steps=1)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == len(seen) == 4  # each epoch: 6 micro-batches in steps of 4 and 2
    assert seen == pytest.approx(logged, rel=1e-3, abs=1e-4)  # before, with num_items_in_batch: 1/4 of the Trainer's


def test_the_step_loss_rules() -> None:
    a, b = torch.tensor(1.0), torch.tensor(3.0)
    assert att.step_loss([], normalized=True) is None
    assert float(att.step_loss([a, b], normalized=False)) == 2.0  # per-micro-batch means: the Trainer divides
    assert float(att.step_loss([a, b], normalized=True)) == 4.0  # already over the step: the Trainer adds
    assert float(att.step_loss([a, b], normalized=True, processes=2)) == 8.0  # average_tokens_across_devices
    assert float(att.step_loss([a], normalized=True, processes=2)) == 2.0
    assert att.step_loss([a], normalized=False) is a


class EvaluatesFirst(transformers.TrainerCallback):  # type: ignore[misc]
    """A user's callback placed before the ThrottleCallback: evaluates at every other step's end."""

    trainer: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % 2 == 1:
            self.trainer.evaluate()


def test_an_evaluate_from_a_callback_before_ours_keeps_every_loss_and_the_bound(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 1)
    seen: list[tuple[int, float]] = []
    cb.throttle.on_complete(lambda step, values: seen.append((step, float(values["loss"]))))
    model, user, probe = Tiny(dev), EvaluatesFirst(), Probe(dev, cb)
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, eval_strategy="no"), train_dataset=_data(),
                                   eval_dataset=_data(8), callbacks=[user, cb, probe])
    user.trainer = trainer
    trainer.train()
    steps = EPOCHS * SAMPLES // (4 * 2)
    assert [step for step, _ in seen] == list(range(steps))  # before: the evaluated steps arrived without a loss
    means = [(a + b) / 2 for a, b in zip(model.losses[::2], model.losses[1::2], strict=True)]
    assert [value for _, value in seen] == pytest.approx(means)
    assert probe.unfinished == [0] * steps and len(probe.in_flight_at_eval) == (steps + 1) // 2


def test_evaluation_time_is_neither_loop_time_nor_device_idle(tmp_path: Path) -> None:
    class SlowEval(Tiny):
        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            if not self.training:
                self.dev.host(0.05)  # 0.1 s of evaluation per epoch, on the host
            return super().forward(x, labels)

    dev = FakeDevice()
    cb = _callback(dev, 2, sample_every=1)
    _, probe = _train(cb, dev, tmp_path, model=SlowEval(dev))
    stats = cb.throttle.stats
    steps = EPOCHS * SAMPLES // (4 * 2)
    assert probe.in_flight_at_eval == [0] * EPOCHS
    assert stats.wall_s == pytest.approx(2 * steps * DEVICE_S, rel=0.1)  # the 0.3 s of evaluation is not loop time
    assert stats.verdict.startswith("device-bound")
    assert stats.idle_fraction < 0.1, stats.as_dict()  # a pause is not device idle


def test_an_evaluate_after_a_failed_train_records_nothing_and_bills_nothing(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    seen: list[int] = []
    cb.throttle.on_complete(lambda step, values: seen.append(step))
    model = Tiny(dev)
    model.fail_at = 5  # the third step's second micro-batch
    trainer = _trainer(cb, dev, tmp_path, model)
    with pytest.raises(KeyError, match="boom"):
        trainer.train()
    trainer.evaluate()
    assert cb.throttle.stats.steps == 2 and seen == [0, 1]  # before: the failed step was recorded, with half a loss
    dev.host(2.0)  # the user fixes the data, then trains again
    model.fail_at = None
    _train(cb, dev, tmp_path, model=model, num_train_epochs=1, eval_strategy="no")
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == 2 + 3 and seen == list(range(5))
    assert stats.wall_s < 0.5 and stats.fetch_s < 0.1, stats.as_dict()


def _gpu_args(non_blocking: bool, pinned: bool) -> Any:
    return SimpleNamespace(device=torch.device("cuda"), accelerator_config=SimpleNamespace(non_blocking=non_blocking),
                           dataloader_pin_memory=pinned, logging_nan_inf_filter=False,
                           include_num_input_tokens_seen="no")


def test_blocking_micro_batch_copies_on_an_accelerator_are_named(tmp_path: Path) -> None:
    advice = dict(att.transformers_advice(_gpu_args(non_blocking=False, pinned=True)))
    assert set(advice) == {"blocking_copies"}
    assert 'accelerator_config={"non_blocking": True}' in advice["blocking_copies"]
    assert "without dataloader_pin_memory=True" in dict(att.transformers_advice(_gpu_args(True, False)))[
        "blocking_copies"]
    assert att.transformers_advice(_gpu_args(non_blocking=True, pinned=True)) == []
    cpu = _args(tmp_path)  # the CPU: nothing to overlap, nothing said
    assert cpu.device.type == "cpu" and att.transformers_advice(cpu) == []
    args = _args(tmp_path, accelerator_config={"non_blocking": True}, dataloader_pin_memory=True)
    assert args.accelerator_config.non_blocking is True  # the setting the advice reads, as TrainingArguments keeps it


def test_the_advised_settings_reach_accelerates_loader(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    trainer = _trainer(cb, dev, tmp_path, Tiny(dev), accelerator_config={"non_blocking": True},
                       dataloader_pin_memory=True)
    loader = trainer.get_train_dataloader()
    assert loader._non_blocking is True  # accelerate's send_to_device(..., non_blocking=True) for every batch


def test_the_copy_advice_is_given_once_through_the_callback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    monkeypatch.setattr(att, "_copy_advice", lambda args: [("blocking_copies", "copies block")])
    with pytest.warns(SyncAdvice, match="copies block") as record:
        _train(cb, dev, tmp_path, num_train_epochs=1, eval_strategy="no")
        _train(cb, dev, tmp_path, num_train_epochs=1, eval_strategy="no")
    assert sum("copies block" in str(w.message) for w in record) == 1


def test_a_real_causal_lm_under_accumulation_delivers_the_trainers_loss(tmp_path: Path) -> None:
    """GPT-2 (tiny, random) gets num_items_in_batch: before, each step's loss was 1/4 of the Trainer's at GA=4."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32, eos_token_id=0,
                                     bos_token_id=0)
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(16):
        ids = torch.randint(0, 64, (16,), generator=g)
        labels = ids.clone()
        labels[: i % 7] = -100  # uneven token counts: a mean of means would differ from the Trainer's loss
        rows.append({"input_ids": ids, "labels": labels})
    cb = att.ThrottleCallback(2, device="cpu")
    seen: list[float] = []
    cb.throttle.on_complete(lambda step, values: seen.append(float(values["loss"])))
    args = _args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4, num_train_epochs=1,
                 eval_strategy="no", logging_strategy="steps", logging_steps=1, learning_rate=1e-3)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=rows,
                                   callbacks=[cb])
    assert trainer.model_accepts_loss_kwargs
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(seen) == len(logged) == 2
    assert seen == pytest.approx(logged, rel=1e-3)


def test_a_cpu_trainer_on_a_synchronous_throttle_is_given_no_sync_advice(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = att.ThrottleCallback(2, device="cpu")  # nothing in flight: the filter's bool() waits for no device
    trainer = _trainer(cb, dev, tmp_path, Tiny(dev), logging_nan_inf_filter=True, max_steps=2, eval_strategy="no")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.train()
    assert [str(w.message) for w in record if issubclass(w.category, SyncAdvice)] == []  # before: "makes it moot"


def test_sync_advice_points_at_the_users_line_that_started_training(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)  # an asynchronous device: the filter syncs it
    trainer = _trainer(cb, dev, tmp_path, Tiny(dev), logging_nan_inf_filter=True, max_steps=2, eval_strategy="no")
    with pytest.warns(SyncAdvice) as record:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        trainer.train()
    (advice,) = [w for w in record if issubclass(w.category, SyncAdvice)]
    assert (advice.filename, advice.lineno) == (__file__, line)  # before: asyncthrottle/framework.py


def _train_heard(dev: FakeDevice, tmp_path: Path, max_steps: int,
                 resume: str | None) -> tuple[list[int], list[int], Any]:
    """One train() with a new callback (as in a new process); the callback's and the throttle's step numbers."""
    cb = _callback(dev, 2)
    heard: list[int] = []
    own: list[int] = []
    cb.on_complete(lambda step, values: heard.append(step))
    cb.throttle.on_complete(lambda step, values: own.append(step))
    trainer = _trainer(cb, dev, tmp_path, Tiny(dev), max_steps=max_steps, save_strategy="steps", save_steps=3,
                       eval_strategy="no", logging_strategy="steps", logging_steps=1)
    trainer.train(resume_from_checkpoint=resume)
    logged = [entry["step"] for entry in trainer.state.log_history if "loss" in entry]
    assert [cb.framework_step(step) for step in own] == heard
    return heard, own, logged


def test_on_complete_hears_the_trainers_global_step_and_a_resume_goes_on_from_its_checkpoint(tmp_path: Path) -> None:
    dev = FakeDevice()
    heard, own, logged = _train_heard(dev, tmp_path, 3, None)
    assert heard == logged == [1, 2, 3]  # before: 0, 1, 2 (one less than the Trainer's step)
    heard, own, logged = _train_heard(dev, tmp_path, 6, str(tmp_path / "checkpoint-3"))
    assert heard == logged[-3:] == [4, 5, 6]  # before: 0, 1, 2 again, over the first run's steps
    assert own == [0, 1, 2]  # the throttle's own count stays reachable: cb.throttle.on_complete


def test_the_callbacks_on_complete_can_be_removed_and_pickles(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    heard: list[int] = []

    def keep(step: int, values: dict[str, Any]) -> None:
        heard.append(step)

    assert cb.on_complete(keep) is keep  # usable as a decorator
    cb.remove_on_complete(keep)
    with pytest.raises(ValueError, match="not registered"):
        cb.remove_on_complete(keep)
    cb.on_complete(_named)
    copy = pickle.loads(pickle.dumps(cb))
    _train(copy, dev, tmp_path, max_steps=2, eval_strategy="no")
    assert heard == [] and _NAMED == [1, 2]  # the copy's callback hears the Trainer's steps


_NAMED: list[int] = []


def _named(step: int, values: dict[str, Any]) -> None:
    """A picklable callback of the callback's own on_complete."""
    _NAMED.append(step)
