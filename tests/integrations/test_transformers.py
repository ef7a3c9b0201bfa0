"""ThrottleCallback on the real transformers.Trainer (CPU, fake device events): optimizer steps, losses, drains."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
att = pytest.importorskip("asyncthrottle.transformers")

from helpers import inside  # noqa: E402

from asyncthrottle.backends import torch as torch_backend  # noqa: E402
from asyncthrottle.parts.syncaudit import SYNC_MESSAGE, SyncAdvice  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402

SAMPLES, BATCH, EPOCHS, DEVICE_S, HOST_S = 24, 4, 3, 0.010, 0.001


class Tiny(torch.nn.Module):
    """A linear regression returning ``{"loss", "logits"}``; its training forwards launch fake device work."""

    def __init__(self, dev: FakeDevice) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.dev = dev
        self.losses: list[float] = []  # every training micro-batch's loss, as the model computed it
        self.fail_at: int | None = None

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        logits = self.layer(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.mse_loss(logits, labels)
        if self.training:
            if self.fail_at is not None and len(self.losses) == self.fail_at:
                raise KeyError("boom in forward")
            self.losses.append(out["loss"].item())  # the test's reference (the CPU: nothing to sync with)
            self.dev.host(HOST_S)
            self.dev.launch(DEVICE_S)
        return out


class Probe(transformers.TrainerCallback):  # type: ignore[misc]
    """Placed after the ThrottleCallback: at each step's start, how many earlier steps are unfinished."""

    def __init__(self, dev: FakeDevice, cb: Any) -> None:
        self.dev, self.cb = dev, cb
        self.finishes: list[float] = []
        self.unfinished: list[int] = []
        self.in_flight_at_eval: list[int] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = self.dev.clock()
        self.unfinished.append(sum(1 for end in self.finishes if end > now))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finishes.append(self.dev.busy_until)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.in_flight_at_eval.append(self.cb.throttle.stats.steps - self.cb.throttle.stats.completed)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.in_flight_at_eval.append(self.cb.throttle.stats.steps - self.cb.throttle.stats.completed)


def _data(n: int = SAMPLES) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return [{"x": row, "labels": row.sum(0, keepdim=True)} for row in x]


def _args(tmp_path: Path, **options: Any) -> Any:
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path), use_cpu=True, num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, gradient_accumulation_steps=2, eval_strategy="epoch", save_strategy="no",
        report_to=[], disable_tqdm=True, logging_strategy="no", dataloader_num_workers=0, learning_rate=0.01,
        remove_unused_columns=False, logging_nan_inf_filter=False, seed=0,
    )
    settings.update(options)
    return transformers.TrainingArguments(**settings)


def _callback(dev: FakeDevice, depth: int = 2, **options: Any) -> Any:
    return att.ThrottleCallback(depth, events=dev.event, wait=dev.wait("poll"), clock=dev.clock, **options)


def _train(cb: Any, dev: FakeDevice, tmp_path: Path, model: Tiny | None = None, **options: Any) -> tuple[Tiny, Probe]:
    model = model or Tiny(dev)
    probe = Probe(dev, cb)
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, **options), train_dataset=_data(),
                                   eval_dataset=_data(8), callbacks=[cb, probe])
    trainer.train()
    return model, probe


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_one_step_per_optimizer_step_bounded_with_every_loss(depth: int, tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, depth)
    seen: list[tuple[int, float]] = []
    cb.throttle.on_complete(lambda step, values: seen.append((step, float(values["loss"]))))
    model, probe = _train(cb, dev, tmp_path)
    steps = EPOCHS * SAMPLES // (BATCH * 2)  # two micro-batches per optimizer step
    assert len(model.losses) == 2 * steps and len(probe.unfinished) == steps
    # The bound, checked independently at each step's start; the host runs ahead up to it (drained each epoch).
    assert probe.unfinished == [min(i, depth - 1) for i in range(steps // EPOCHS)] * EPOCHS
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == steps  # no lost step over 3 epochs with evaluation
    assert [step for step, _ in seen] == list(range(steps))
    means = [(a + b) / 2 for a, b in zip(model.losses[::2], model.losses[1::2], strict=True)]
    assert [value for _, value in seen] == pytest.approx(means)  # each step: the mean of its micro-batches
    assert probe.in_flight_at_eval == [0] * EPOCHS  # drained before every evaluation
    assert cb._handle is None  # the forward hook is gone after training


def test_an_uneven_epoch_tail_and_no_accumulation(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    model, _ = _train(cb, dev, tmp_path, gradient_accumulation_steps=1, per_device_train_batch_size=5,
                      num_train_epochs=1, eval_strategy="no")
    assert cb.throttle.stats.steps == 5  # 24 samples in batches of 5: the short last batch is a step too
    assert cb.throttle.latest["loss"].item() == pytest.approx(model.losses[-1])


def test_checkpoints_are_saved_with_nothing_in_flight(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 3)
    _, probe = _train(cb, dev, tmp_path, num_train_epochs=1, eval_strategy="no", save_strategy="steps", save_steps=2,
                      gradient_accumulation_steps=1)
    assert probe.in_flight_at_eval == [0, 0, 0]  # saved after steps 2, 4, 6: each with nothing in flight
    assert probe.unfinished[:2] == [0, 1] and cb.throttle.stats.completed == 6


def test_an_exception_blocks_on_nothing_and_the_next_train_starts_clean(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    model = Tiny(dev)
    model.fail_at = 5  # the third step's second micro-batch
    with pytest.raises(KeyError, match="boom"):
        _train(cb, dev, tmp_path, model=model)
    assert cb.throttle.stats.steps == 2 and cb.step_open
    assert dev.clock() < dev.busy_until  # nothing waited for the device
    model.fail_at = None
    _train(cb, dev, tmp_path, model=model, num_train_epochs=1, eval_strategy="no")
    assert not cb.step_open and cb.throttle.stats.steps == cb.throttle.stats.completed == 2 + 3


def _keep(step: int, values: dict[str, Any]) -> None:
    """A picklable on_complete callback."""


def test_the_callback_pickles_and_trains(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    cb.throttle.on_complete(_keep)
    copy = pickle.loads(pickle.dumps(cb))
    assert copy.throttle is not cb.throttle and inside(copy.throttle).values.callbacks == [_keep]
    copy_dev = copy._options["events"].__self__
    _, probe = _train(copy, copy_dev, tmp_path, num_train_epochs=1)
    assert copy.throttle.stats.completed == 3 and max(probe.unfinished) == 1
    pickle.dumps(copy)  # after training too (the hook handle stays behind)


def test_settings_that_sync_every_step_are_named_once(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    with pytest.warns(SyncAdvice) as record:
        _train(cb, dev, tmp_path, logging_nan_inf_filter=True, include_num_input_tokens_seen=False,
               num_train_epochs=1, eval_strategy="no")
    messages = [str(w.message) for w in record if issubclass(w.category, SyncAdvice)]
    assert len(messages) == 1 and "logging_nan_inf_filter=False" in messages[0]
    advice = dict(att.transformers_advice(_args(tmp_path, include_num_input_tokens_seen=True)))
    assert set(advice) == {"tokens_seen"} and "include_num_input_tokens_seen='no'" in advice["tokens_seen"]


class FakeCuda:
    def __init__(self) -> None:
        self.mode: Any = 0

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode


def test_the_audit_names_the_trainers_own_sync_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``logging_nan_inf_filter`` evaluates ``isnan(loss) or isinf(loss)`` per micro-batch: two ``__bool__``
    calls, which on CUDA are syncs. Here each ``Tensor.__bool__`` raises torch's sync warning from inside torch,
    so the audit must skip torch's frames and name the line in transformers/trainer.py."""
    cuda = FakeCuda()
    monkeypatch.setattr(torch_backend, "cuda_module", lambda: cuda)
    real_bool = torch.Tensor.__bool__

    def syncing_bool(self: Any) -> bool:
        warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # from a frame inside torch, like the real one
        return bool(real_bool(self))

    syncing_bool.__code__ = syncing_bool.__code__.replace(co_filename=torch._tensor.__file__)
    monkeypatch.setattr(torch.Tensor, "__bool__", syncing_bool)
    dev = FakeDevice()
    cb = _callback(dev, 2, detect_sync="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyncAdvice)
        _train(cb, dev, tmp_path, logging_nan_inf_filter=True, num_train_epochs=1, eval_strategy="no")
    audit = cb.throttle.sync_audit
    assert audit.steps == 3
    sites = dict(audit.top(5))
    trainer_sites = {site: rate for site, rate in sites.items() if site.startswith("transformers/trainer.py:")}
    assert sum(trainer_sites.values()) == pytest.approx(4.0)  # 2 per micro-batch, 2 micro-batches per step
    assert "syncs/step \u2014 transformers/trainer.py:" in cb.throttle.summary()
    assert cuda.mode == 0


@pytest.mark.slow
def test_the_transformers_example_learns_and_logs_every_step() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    example = pytest.importorskip("transformers_mnist")
    lines: list[str] = []
    args = example.parse_args(["--data", "synthetic", "--device", "cpu", "--no-progress", "--batch-size", "32",
                               "--max-steps", "30", "--epochs", "1", "--grad-accum", "2", "--seed", "1", "--lr", "0.2"])
    result = example.train(args, log=lines.append)
    assert [step for step, _ in result["losses"]] == list(range(30))
    losses = [value for _, value in result["losses"]]
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]) and result["eval_loss"] < losses[0]
    assert any(line.startswith("asyncthrottle: 30 steps") for line in lines)


def test_the_callback_times_each_micro_batch_forward_backward_and_the_optimizer(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, sample_every=1)
    _train(cb, dev, tmp_path)
    sections = cb.throttle.stats.sections
    assert sections is not None and set(sections) == {"forward", "backward", "optimizer"}
    assert cb._pre_handle is None  # the pre-hook is gone after training
