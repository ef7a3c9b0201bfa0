"""ThrottleCallback at Lightning's edges (CPU, fake device events): drains inside a step, pauses, skips, restarts."""

from __future__ import annotations

import functools
import inspect
import re
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")
atl = pytest.importorskip("asyncthrottle.lightning")

from test_lightning import BATCHES, DEVICE_S, EPOCHS, Recorder, Tiny, _callback, _loader, _trainer  # noqa: E402

from asyncthrottle.parts.syncaudit import SyncAdvice  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402


class SavesFirst(L.Callback):
    """A user's callback placed before the ThrottleCallback: saves a checkpoint at every other batch end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % 2 == 0:
            trainer.save_checkpoint(self.folder / "user.ckpt")


def _seen(cb: Any) -> list[tuple[int, float]]:
    seen: list[tuple[int, float]] = []
    cb.throttle.on_complete(lambda step, values: seen.append((step, float(values["loss"]))))
    return seen


def test_a_save_from_a_callback_before_ours_keeps_every_loss(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 1)
    seen = _seen(cb)
    model = Tiny(dev)
    _trainer([SavesFirst(tmp_path), cb], tmp_path, limit_val_batches=0).fit(model, _loader())
    steps = BATCHES * EPOCHS
    assert cb.throttle.stats.steps == cb.throttle.stats.completed == steps
    assert [step for step, _ in seen] == list(range(steps))  # before: every other step arrived without its loss
    assert [value for _, value in seen] == pytest.approx(model.losses)
    assert model.unfinished == [0] * steps


def test_a_save_inside_training_step_neither_ends_the_step_nor_breaks_the_bound(tmp_path: Path) -> None:
    class SavesInside(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx % 3 == 0:  # before the step's device work: a drain here must not record the step
                self.trainer.save_checkpoint(tmp_path / "inside.ckpt")
            return super().training_step(batch, batch_idx)

    dev = FakeDevice()
    cb = _callback(dev, 1)
    seen = _seen(cb)
    model = SavesInside(dev)
    _trainer([cb], tmp_path).fit(model, _loader(), _loader(2))
    steps = BATCHES * EPOCHS
    assert model.unfinished == [0] * steps  # depth 1: before, the step after each save started with 1 unfinished
    assert [step for step, _ in seen] == list(range(steps))
    assert [value for _, value in seen] == pytest.approx(model.losses)


def test_validation_time_is_neither_loop_time_nor_device_idle(tmp_path: Path) -> None:
    class SlowValidation(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            super().validation_step(batch, batch_idx)
            self.dev.host(0.05)  # 0.1 s of validation per epoch, on the host

    dev = FakeDevice()
    cb = _callback(dev, 2, sample_every=1)
    model = SlowValidation(dev)
    _trainer([cb], tmp_path).fit(model, _loader(), _loader(2))
    stats = cb.throttle.stats
    steps = BATCHES * EPOCHS
    assert model.val_in_flight == [0, 0] * EPOCHS  # drained before each validation
    assert stats.wall_s == pytest.approx(steps * DEVICE_S, rel=0.1)  # the loop's time; the 0.3 s of validation is not
    assert stats.verdict.startswith("device-bound")
    # The device is busy throughout each epoch: a timing start marker paired with an end event from before the
    # validation pause would count the pause as device idle (before: 88 % idle for a device-bound loop).
    assert stats.idle_fraction < 0.1, stats.as_dict()


def test_save_weights_only_checkpoints_drain_and_are_not_loop_time(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    class SlowSave(Tiny):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:  # called with save_weights_only too
            self.val_in_flight.append(self.trainer.callbacks[0].throttle.in_flight)
            self.dev.host(0.5)  # a slow file system

    dev = FakeDevice()
    cb = _callback(dev, 3)
    model = SlowSave(dev)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, save_weights_only=True)
    _trainer([cb, saver], tmp_path, max_epochs=1, enable_checkpointing=True, limit_val_batches=0).fit(
        model, _loader())
    assert len(model.val_in_flight) == BATCHES // 2
    assert model.val_in_flight == [0] * (BATCHES // 2)  # before: 2 steps in flight while the file was written
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == BATCHES
    assert stats.wall_s < 0.5  # the 1.5 s of saving is not billed to the loop


def test_the_time_between_a_failed_fit_and_the_next_is_not_loop_time(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    model = Tiny(dev, fail_at=4)
    with pytest.raises(KeyError, match="boom"):
        _trainer([cb], tmp_path, limit_val_batches=0).fit(model, _loader())
    dev.host(2.0)  # the user looks at the traceback, fixes the data, calls fit() again
    model.fail_at = None
    _trainer([cb], tmp_path, max_epochs=1, limit_val_batches=0).fit(model, _loader())
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == 4 + BATCHES
    assert stats.wall_s < 0.5 and stats.fetch_s < 0.1, stats.as_dict()  # before: fetching 2 s, "input-bound"
    assert not stats.verdict.startswith("input-bound")


def test_a_batch_skipped_by_on_train_batch_start_is_no_step(tmp_path: Path) -> None:
    class SkipsRest(Tiny):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if batch_idx == 2 else None  # skip the rest of every epoch

    dev = FakeDevice()
    cb = _callback(dev, 2)
    seen = _seen(cb)
    model = SkipsRest(dev)
    _trainer([cb], tmp_path).fit(model, _loader(), _loader(2))
    assert len(model.losses) == 2 * EPOCHS
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == 2 * EPOCHS  # before: 8 steps for 6 training_step calls
    assert [step for step, _ in seen] == list(range(2 * EPOCHS))
    assert [value for _, value in seen] == pytest.approx(model.losses)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_stats_are_logged_on_lightnings_own_step_axis(accumulate: int, tmp_path: Path) -> None:
    class Logs(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"], on_step=True, on_epoch=False)
            return out

    dev = FakeDevice()
    cb = _callback(dev, 2)
    recorder = Recorder()
    _trainer([cb], tmp_path, max_epochs=2, logger=recorder, log_every_n_steps=2, limit_val_batches=0,
             accumulate_grad_batches=accumulate).fit(Logs(dev), _loader(12))
    lightning_steps = [step for step, m in recorder.logged if "train_loss" in m]
    ours = [step for step, m in recorder.logged if "asyncthrottle/steps" in m]
    assert lightning_steps and ours == lightning_steps  # before: one step off, and repeated under accumulation
    assert len(set(ours)) == len(ours)


def _readme_lightning_snippet() -> str:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "frameworks.md").read_text()
    section = readme.split("## Lightning", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_readmes_lightning_example_runs_when_training_step_returns_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class SometimesNone(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            return None if batch_idx == 1 else out  # Lightning skips the optimizer step for this batch

    dev = FakeDevice()
    trainer = functools.partial(L.Trainer, max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=True, enable_model_summary=False, default_root_dir=tmp_path)
    names: dict[str, Any] = {"lightning": types.SimpleNamespace(Trainer=trainer), "model": SometimesNone(dev),
                             "train_loader": _loader(), "val_loader": None}
    exec(_readme_lightning_snippet(), names)  # the docs' own code (docs/frameworks.md), as a user copies it
    printed = capsys.readouterr().out  # the bar's \r-updates and the printed losses share stdout
    assert [int(step) for step in re.findall(r"(\d+) \d+\.\d+\n", printed)] == [0, 2, 3, 4, 5]  # no loss for 1
    assert f"asyncthrottle: {BATCHES} steps" in printed


def test_under_gradient_accumulation_the_loss_is_the_one_training_step_returned(tmp_path: Path) -> None:
    class Logs(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"], on_step=True, on_epoch=False)
            return out

    dev = FakeDevice()
    cb = _callback(dev, 2)
    seen = _seen(cb)
    recorder, bar = Recorder(), atl.ThrottleProgressBar()
    model = Logs(dev)
    trainer = _trainer([cb, bar], tmp_path, max_epochs=1, logger=recorder, log_every_n_steps=1, limit_val_batches=0,
                       accumulate_grad_batches=3, enable_progress_bar=True)
    trainer.fit(model, _loader())
    assert [value for _, value in seen] == pytest.approx(model.losses, rel=1e-6)  # before: each divided by 3
    logged = [m["train_loss"] for _, m in recorder.logged if "train_loss" in m]  # self.log's, once per optimizer step
    assert logged == pytest.approx(model.losses[2::3], rel=1e-6)
    assert float(cb.throttle.latest["loss"]) == pytest.approx(model.losses[-1], rel=1e-6)
    shown = bar.get_metrics(trainer, model)["loss"]  # the bar's figure
    assert float(shown) == pytest.approx(model.losses[-1], rel=1e-3)


def test_a_synchronous_throttle_is_given_no_sync_advice(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ThroughputMonitor

    dev = FakeDevice()
    cb = atl.ThrottleCallback(2, device="cpu")  # the CPU: each .item() waits for no device
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _trainer([cb, monitor], tmp_path, max_epochs=1, limit_val_batches=0).fit(Tiny(dev, prog_bar=True), _loader())
    assert [str(w.message) for w in record if issubclass(w.category, SyncAdvice)] == []  # before: two


def test_sync_advice_points_at_the_users_line_that_called_fit(tmp_path: Path) -> None:
    dev = FakeDevice()
    trainer = _trainer([_callback(dev, 2)], tmp_path, max_epochs=1, limit_val_batches=0)
    with pytest.warns(SyncAdvice) as record:
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        trainer.fit(Tiny(dev, prog_bar=True), _loader())
    (advice,) = [w for w in record if issubclass(w.category, SyncAdvice)]
    assert (advice.filename, advice.lineno) == (__file__, line)  # before: asyncthrottle/framework.py


def _heard(cb: Any) -> list[int]:
    heard: list[int] = []
    cb.on_complete(lambda step, values: heard.append(step))
    return heard


def test_on_complete_hears_the_batch_index_over_the_fit_and_a_resume_goes_on_from_its_checkpoint(
        tmp_path: Path) -> None:
    dev = FakeDevice()
    first = _callback(dev, 2)
    heard = _heard(first)
    trainer = _trainer([first], tmp_path, max_epochs=1, limit_val_batches=0, accumulate_grad_batches=2)
    trainer.fit(Tiny(dev), _loader())
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    assert heard == list(range(BATCHES))  # each micro-batch keeps its own number
    second = _callback(dev, 2)  # as in a new process: the throttle counts from 0 again
    heard = _heard(second)
    _trainer([second], tmp_path, max_epochs=2, limit_val_batches=0, accumulate_grad_batches=2).fit(
        Tiny(dev), _loader(), ckpt_path=tmp_path / "one.ckpt")
    assert heard == list(range(BATCHES, 2 * BATCHES))  # before: 0 .. 5 again, over the first fit's steps
    assert [second.framework_step(step) for step in range(BATCHES)] == heard
