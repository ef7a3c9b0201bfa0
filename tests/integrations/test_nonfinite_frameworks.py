"""A NaN loss in a real HF Trainer and a real Lightning fit is reported at its step, without a sync (fake device)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.parts.syncaudit import SyncAdvice
from asyncthrottle.testing import FakeDevice

torch = pytest.importorskip("torch")

NAN_AT, DEVICE_S = 5, 0.010  # the optimizer step whose loss is NaN


def _poisoned(loss: Any, step: int) -> Any:
    """The loss, made NaN (on the "device", without looking at it) at step ``NAN_AT`` only."""
    return loss * float("nan") if step == NAN_AT else loss


# -- Hugging Face -----------------------------------------------------------------------------------------------


def _hf_run(tmp_path: Path, nonfinite: str | None, **settings: Any) -> tuple[Any, FakeDevice, list[int], Any]:
    transformers = pytest.importorskip("transformers")
    att = pytest.importorskip("asyncthrottle.transformers")
    dev = FakeDevice()

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.forwards = 0

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            logits = self.layer(x)
            out: dict[str, Any] = {"logits": logits}
            if labels is not None and self.training:
                step, self.forwards = self.forwards, self.forwards + 1  # one micro-batch per optimizer step
                # The parameters stay finite: only the reported loss is NaN (as a bad batch's loss would be).
                loss = torch.nn.functional.mse_loss(logits, labels)
                out["loss"] = loss + (_poisoned(loss.detach(), step) - loss.detach())
                dev.launch(DEVICE_S)
            return out

    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    data = [{"x": row, "labels": row.sum(0, keepdim=True)} for row in x]
    options: dict[str, Any] = dict(
        output_dir=str(tmp_path), use_cpu=True, num_train_epochs=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=1, eval_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
        logging_strategy="steps", logging_steps=1, dataloader_num_workers=0, learning_rate=0.01,
        remove_unused_columns=False, logging_nan_inf_filter=False, seed=0,
    )
    options.update(settings)
    cb = att.ThrottleCallback(2, events=dev.event, wait=dev.wait("poll"), clock=dev.clock, nonfinite=nonfinite)
    seen: list[int] = []
    cb.throttle.on_complete(lambda step, values: seen.append(step))
    trainer = transformers.Trainer(model=Tiny(), args=transformers.TrainingArguments(**options),
                                   train_dataset=data, callbacks=[cb])
    return cb, dev, seen, trainer


def test_the_hf_trainer_reports_the_nan_step_with_the_filter_off(tmp_path: Path) -> None:
    cb, dev, seen, trainer = _hf_run(tmp_path, "warn")
    with pytest.warns(at.NonFiniteWarning) as record:
        trainer.train()
    warnings = [w for w in record if issubclass(w.category, at.NonFiniteWarning)]
    messages = [str(w.message) for w in warnings]
    # the Trainer's global step of the NaN step (before: the throttle's own count, one less)
    assert len(messages) == 1 and f"'loss' of step {NAN_AT + 1} is nan" in messages[0]
    # at the user's train() line, not inside transformers or torch
    assert warnings[0].filename == __file__
    stats = cb.throttle.stats
    assert stats.nonfinite == 1 and stats.nonfinite_first == NAN_AT + 1 and stats.completed == 10
    assert seen == list(range(10)) and dev.syncs == 0  # cb.throttle.on_complete: the throttle's own count
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 10 and logged[NAN_AT] != logged[NAN_AT]  # the Trainer logs it too, unfiltered


def test_the_hf_trainer_stops_within_depth_steps_under_raise(tmp_path: Path) -> None:
    _, dev, _, trainer = _hf_run(tmp_path, "raise")
    with pytest.raises(at.NonFiniteError) as caught:
        trainer.train()
    assert caught.value.step == NAN_AT + 1 and caught.value.name == "loss"  # the Trainer's global step
    assert trainer.model.forwards <= NAN_AT + 2  # the NaN step and at most depth - 1 = 1 after it
    assert dev.syncs == 0


def test_the_filter_advice_says_the_callback_keeps_the_nan_report(tmp_path: Path) -> None:
    att = pytest.importorskip("asyncthrottle.transformers")
    _, _, _, trainer = _hf_run(tmp_path, "warn", logging_nan_inf_filter=True, max_steps=2)
    with pytest.warns(SyncAdvice) as record:
        trainer.train()
    (message,) = [str(w.message) for w in record if issubclass(w.category, SyncAdvice)]
    assert "once per micro-batch" in message and "logging_nan_inf_filter=False" in message
    assert "still reports a NaN/Inf step loss" in message and "without that sync" in message
    off = dict(att.transformers_advice(trainer.args, nonfinite=None))["nan_inf_filter"]
    assert "off here" in off and "still reports" not in off


# -- Lightning --------------------------------------------------------------------------------------------------


def test_the_lightning_callback_reports_nan_steps_from_its_deferred_loss(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning.pytorch")
    atl = pytest.importorskip("asyncthrottle.lightning")
    dev = FakeDevice()

    class Tiny(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.steps = 0

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            step, self.steps = self.steps, self.steps + 1
            dev.launch(DEVICE_S)
            return {"loss": loss + (_poisoned(loss.detach(), step) - loss.detach())}

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    cb = atl.ThrottleCallback(2, events=dev.event, wait=dev.wait("poll"), clock=dev.clock)
    trainer = L.Trainer(callbacks=[cb], max_epochs=1, accelerator="cpu", devices=1, enable_checkpointing=False,
                        logger=False, enable_model_summary=False, enable_progress_bar=False,
                        default_root_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit(Tiny(), loader)
    messages = [str(w.message) for w in record if issubclass(w.category, at.NonFiniteWarning)]
    assert len(messages) == 1 and f"'loss' of step {NAN_AT} is nan" in messages[0]
    stats = cb.throttle.stats
    assert stats.nonfinite == 1 and stats.nonfinite_first == NAN_AT and stats.completed == 10 and dev.syncs == 0
