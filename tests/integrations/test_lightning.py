"""ThrottleCallback on the real lightning.Trainer (CPU, fake device events): bound, no lost step, losses, pickling."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import forked
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")
atl = pytest.importorskip("asyncthrottle.lightning")

from helpers import inside  # noqa: E402

from asyncthrottle.backends import torch as torch_backend  # noqa: E402
from asyncthrottle.parts.syncaudit import SYNC_MESSAGE, SyncAdvice  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402

BATCHES, EPOCHS, DEVICE_S, HOST_S = 6, 3, 0.010, 0.001


class Tiny(L.LightningModule):
    """A linear regression whose every step launches fake device work and records what it saw."""

    def __init__(self, dev: FakeDevice, *, fail_at: int | None = None, prog_bar: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.dev, self.fail_at, self.prog_bar = dev, fail_at, prog_bar
        self.losses: list[float] = []  # what the model computed, per step
        self.finishes: list[float] = []  # when each step's device work ends (fake time)
        self.unfinished: list[int] = []  # earlier steps unfinished when each step starts
        self.val_in_flight: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        now = self.dev.clock()
        self.unfinished.append(sum(1 for end in self.finishes if end > now))
        if self.fail_at is not None and len(self.losses) == self.fail_at:
            raise KeyError("boom in training_step")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.losses.append(loss.item())  # the test's reference value (the CPU: no device to sync)
        if self.prog_bar:
            self.log("train_loss", loss, prog_bar=True)
        self.dev.host(HOST_S)
        self.finishes.append(self.dev.launch(DEVICE_S))
        return {"loss": loss}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_in_flight.append(self.trainer.callbacks[0].throttle.in_flight)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(n: int = BATCHES) -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n * 4, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=4)


def _trainer(callbacks: list[Any], tmp_path: Path, **options: Any) -> Any:
    settings: dict[str, Any] = dict(
        max_epochs=EPOCHS, accelerator="cpu", devices=1, enable_checkpointing=False, logger=False,
        enable_model_summary=False, enable_progress_bar=False, num_sanity_val_steps=0, limit_val_batches=2,
        default_root_dir=str(tmp_path),
    )
    settings.update(options)
    return L.Trainer(callbacks=callbacks, **settings)


def _callback(dev: FakeDevice, depth: int = 2, **options: Any) -> Any:
    return atl.ThrottleCallback(depth, events=dev.event, wait=dev.wait("poll"), clock=dev.clock, **options)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_fit_is_bounded_loses_no_step_and_delivers_every_loss(depth: int, tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, depth)
    seen: list[tuple[int, float]] = []
    cb.throttle.on_complete(lambda step, values: seen.append((step, float(values["loss"]))))
    model = Tiny(dev)
    _trainer([cb], tmp_path).fit(model, _loader(), _loader(2))
    steps = BATCHES * EPOCHS
    assert len(model.unfinished) == steps
    # The bound, checked independently at every step's start; the host runs ahead up to it (drained each epoch).
    assert model.unfinished == [min(i, depth - 1) for i in range(BATCHES)] * EPOCHS
    stats = cb.throttle.stats
    assert stats.steps == stats.completed == steps  # no lost step across epochs and validations
    assert [step for step, _ in seen] == list(range(steps))
    assert [value for _, value in seen] == pytest.approx(model.losses)
    assert model.val_in_flight == [0, 0] * EPOCHS  # drained before each validation
    assert cb.throttle.in_flight == 0 and not cb.step_open


def test_an_exception_drops_the_step_and_blocks_on_nothing(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    model = Tiny(dev, fail_at=4)
    with pytest.raises(KeyError, match="boom"):
        _trainer([cb], tmp_path).fit(model, _loader())
    stats = cb.throttle.stats
    assert stats.steps == 4 and not cb.step_open
    assert dev.clock() < model.finishes[-1]  # nothing waited for the steps in flight
    cb.throttle.drain()  # the throttle stays usable
    assert cb.throttle.stats.completed == 4


def _keep(step: int, values: dict[str, Any]) -> None:
    """A picklable on_complete callback."""


def test_the_callback_pickles_before_fit_and_works_after(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    cb.throttle.on_complete(_keep)
    cb.throttle.on_complete(lambda step, values: None)  # does not pickle: stays behind, with a warning
    copy = pickle.loads(pickle.dumps(cb))
    assert "does not pickle" in caplog.text
    assert copy.throttle is not cb.throttle and copy.throttle.depth == 2
    assert inside(copy.throttle).values.callbacks == [_keep]
    copy.throttle.on_complete(lambda step, values: None)
    model = Tiny(copy._options["events"].__self__)  # the unpickled fake device drives the copy
    _trainer([copy], tmp_path, max_epochs=1).fit(model, _loader())
    assert copy.throttle.stats.steps == copy.throttle.stats.completed == BATCHES
    assert max(model.unfinished) == 1


def test_manual_optimization_with_two_optimizers_is_one_step_per_batch(tmp_path: Path) -> None:
    class Manual(Tiny):
        def __init__(self, dev: FakeDevice) -> None:
            super().__init__(dev)
            self.automatic_optimization = False
            self.other = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            total = torch.zeros(())
            for opt, layer in zip(self.optimizers(), (self.layer, self.other), strict=True):
                loss = torch.nn.functional.mse_loss(layer(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                self.finishes.append(self.dev.launch(DEVICE_S))
                total = total + loss.detach()
            self.losses.append(total.item())
            return total

        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(layer.parameters(), lr=0.01) for layer in (self.layer, self.other)]

    dev = FakeDevice()
    cb = _callback(dev, 2)
    model = Manual(dev)
    _trainer([cb], tmp_path, max_epochs=1, limit_val_batches=0).fit(model, _loader())
    assert cb.throttle.stats.steps == BATCHES  # two optimizer steps per batch, one throttle step
    assert cb.throttle.latest["loss"].item() == pytest.approx(model.losses[-1])


class Recorder(L.loggers.Logger):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, Any]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 7

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def test_stats_reach_the_loggers_as_floats_at_their_cadence(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, 2)
    recorder = Recorder()
    _trainer([cb], tmp_path, max_epochs=1, logger=recorder, log_every_n_steps=2, limit_val_batches=0).fit(
        Tiny(dev), _loader())
    ours = [(step, m) for step, m in recorder.logged if "asyncthrottle/steps" in m]
    assert [m["asyncthrottle/steps"] for _, m in ours] == [2.0, 4.0, 6.0]
    assert all(type(value) is float for _, m in ours for value in m.values())
    assert "asyncthrottle/wait_fraction" in ours[-1][1]


def test_the_progress_bar_shows_the_loss_without_reading_progress_bar_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(trainer: Any) -> Any:
        raise AssertionError("ThrottleProgressBar read trainer.progress_bar_metrics (an .item() per value)")

    monkeypatch.setattr(L.Trainer, "progress_bar_metrics", property(refuse))
    dev = FakeDevice()
    cb, bar = _callback(dev, 2), atl.ThrottleProgressBar()
    trainer = _trainer([cb, bar], tmp_path, max_epochs=1, enable_progress_bar=True, num_sanity_val_steps=2)
    trainer.fit(Tiny(dev), _loader(), _loader(2))  # with the sanity check: a validation before the first step
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert float(metrics["loss"]) == pytest.approx(cb.throttle.latest["loss"].item(), rel=1e-3)
    assert metrics["done"] == str(BATCHES) and "inflight" in metrics


def test_settings_that_sync_every_step_are_named_once(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ThroughputMonitor

    dev = FakeDevice()
    cb = _callback(dev, 2)
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 4)
    with pytest.warns(SyncAdvice) as record:
        _trainer([cb, monitor], tmp_path, max_epochs=2, limit_val_batches=0).fit(Tiny(dev, prog_bar=True), _loader())
    messages = [str(w.message) for w in record if issubclass(w.category, SyncAdvice)]
    assert len(messages) == 2  # once each, over 12 steps
    assert any("ThroughputMonitor" in m and "synchronize()" in m for m in messages)
    assert any("prog_bar=True" in m and "train_loss" in m and "ThrottleProgressBar" in m for m in messages)


def test_multi_process_training_on_recent_lightning_is_named() -> None:
    class FakeTrainer:
        callbacks = ()
        world_size = 2

    advice = dict(atl.lightning_advice(FakeTrainer()))
    assert ("sigterm_broadcast" in advice) == (atl._version(L.__version__) >= (2, 5, 2))
    FakeTrainer.world_size = 1
    assert atl.lightning_advice(FakeTrainer()) == []


class FakeCuda:
    """torch.cuda's sync debug mode switches, for the audit on the CPU."""

    def __init__(self) -> None:
        self.mode: Any = 0

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode


def _sync_in_body() -> None:
    warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)


def _sync_after_the_body() -> None:
    warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)


def test_the_audit_counts_syncs_in_the_body_and_after_it_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = FakeCuda()
    monkeypatch.setattr(torch_backend, "cuda_module", lambda: cuda)

    class Syncing(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            assert cuda.mode == "warn"
            _sync_in_body()
            _sync_in_body()
            return super().training_step(batch, batch_idx)

    class After(L.Callback):  # runs after the ThrottleCallback's on_train_batch_end: outside the body
        def on_train_batch_end(self, *args: Any) -> None:
            _sync_after_the_body()

    dev = FakeDevice()
    cb = _callback(dev, 2, detect_sync="warn")
    model = Syncing(dev)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        _trainer([cb, After()], tmp_path).fit(model, _loader(), _loader(2))
    audit = cb.throttle.sync_audit
    steps = BATCHES * EPOCHS
    assert audit.steps == steps and audit.syncs == 3 * steps
    (body, body_rate), (after, after_rate) = audit.top(2)
    assert body.endswith(f"test_lightning.py:{_sync_in_body.__code__.co_firstlineno + 1}") and body_rate == 2.0
    assert after.endswith(f"test_lightning.py:{_sync_after_the_body.__code__.co_firstlineno + 1}")
    assert after_rate == 1.0
    summary = cb.throttle.summary()
    assert "3.0/step on the loop's thread" in summary and f"2.0 syncs/step \u2014 {body}" in summary
    assert sum(SYNC_MESSAGE in str(w.message) for w in shown) == 2  # each site shown once, then only counted
    assert cuda.mode == 0  # restored: the throttle's waits and validation are not audited


def test_import_asyncthrottle_imports_no_framework() -> None:
    import subprocess
    import sys

    code = ("import asyncthrottle, asyncthrottle.framework, sys; "
            "print(sorted(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAST = ["--data", "synthetic", "--device", "cpu", "--no-progress", "--batch-size", "32", "--seed", "1"]


def _example() -> Any:
    import sys

    sys.path.insert(0, str(EXAMPLES))
    return pytest.importorskip("lightning_mnist")


@pytest.mark.slow
def test_the_lightning_example_learns_and_logs_every_step() -> None:
    example = _example()
    lines: list[str] = []
    result = example.train(example.parse_args([*FAST, "--max-steps", "30", "--epochs", "2"]), log=lines.append)
    assert [step for step, _ in result["losses"]] == list(range(60))  # every step's loss, in order
    losses = [value for _, value in result["losses"]]
    assert sum(losses[-10:]) < 0.6 * sum(losses[:10])  # it learns
    assert len(result["accuracies"]) == 2 and result["accuracies"][-1] > 0.5  # chance is 0.1
    assert result["stats"].steps == result["stats"].completed == 60
    assert any(line.startswith("asyncthrottle: 60 steps") for line in lines)


@pytest.mark.slow
def test_the_lightning_example_without_the_advice_is_not_advised_on_the_cpu(tmp_path: Path) -> None:
    """On a GPU it is told why (prog_bar=True syncs each step); on the CPU nothing runs ahead to sync with."""
    example = _example()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        example.train(example.parse_args([*FAST, "--max-steps", "4", "--epochs", "1", "--prog-bar-log"]),
                      log=lambda line: None)
    assert [str(w.message) for w in record if issubclass(w.category, SyncAdvice)] == []


@pytest.mark.slow
def test_the_lightning_example_script_shows_the_deferred_loss_in_its_bar(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(EXAMPLES.parent)}
    proc = forked.run(
        [str(EXAMPLES / "lightning_mnist.py"), "--data", "synthetic", "--max-steps", "12",
         "--epochs", "1", "--device", "cpu"],
        text=True, timeout=120, cwd=tmp_path, env=env,
        preload=(*forked.TORCH, "lightning.pytorch"),  # (the example imports Lightning first thing)
    )
    assert proc.returncode == 0, proc.stderr
    assert "asyncthrottle: 12 steps" in proc.stdout and "test accuracy" in proc.stdout
    assert "loss=" in proc.stdout and "done=" in proc.stdout  # ThrottleProgressBar's postfix (Lightning's bar: stdout)


class _StepsToFile:
    """A picklable on_complete callback: each rank appends its completed steps to its own file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, step: int, values: dict[str, Any]) -> None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(self.folder / f"rank{rank}.txt", "a") as out:
            out.write(f"{step} {float(values['loss']):.6f}\n")


class Plain(L.LightningModule):
    """A module with nothing unpicklable in it (ddp_spawn sends it to each process)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.slow
@pytest.mark.timeout(600)  # two spawned processes import Lightning: past 120 s on a loaded machine
def test_ddp_spawn_carries_the_callback_to_every_process(tmp_path: Path) -> None:
    import multiprocessing

    from lightning.pytorch.strategies import DDPStrategy

    cb = atl.ThrottleCallback(2, device="cpu")
    cb.throttle.on_complete(_StepsToFile(tmp_path))

    # ddp_spawn's launcher, which pickles the trainer, the module and the callback to each process,
    # with the forkserver start method: each process a fork of a server that imported torch,
    # Lightning and this module once, not a fresh interpreter that imports them (the pickling is
    # the same; "ddp_spawn" is DDPStrategy(start_method="spawn"))
    multiprocessing.set_forkserver_preload(["torch", "lightning.pytorch", __name__])
    strategy = DDPStrategy(start_method="forkserver")
    trainer = _trainer([cb], tmp_path, max_epochs=1, devices=2, strategy=strategy, limit_val_batches=0)
    trainer.fit(Plain(), _loader(8))  # before the callback pickled, this failed: cannot pickle '_thread.lock'

    for rank in (0, 1):  # 8 batches split over 2 ranks: 4 steps each, every loss delivered in order
        lines = (tmp_path / f"rank{rank}.txt").read_text().split()
        assert lines[::2] == ["0", "1", "2", "3"]


def test_checkpoints_are_saved_with_nothing_in_flight(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Probe(L.Callback):  # after the ThrottleCallback: what a checkpoint sees
        def __init__(self, cb: Any) -> None:
            self.cb, self.in_flight_at_save = cb, []

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            self.in_flight_at_save.append(self.cb.throttle.stats.in_flight)

    dev = FakeDevice()
    cb = _callback(dev, 3)
    probe = Probe(cb)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    _trainer([cb, probe, saver], tmp_path, max_epochs=1, enable_checkpointing=True, limit_val_batches=0).fit(
        Tiny(dev), _loader())
    assert probe.in_flight_at_save and probe.in_flight_at_save == [0] * len(probe.in_flight_at_save)
    assert cb.throttle.stats.steps == BATCHES


def test_the_callback_times_forward_backward_and_optimizer_as_sections(tmp_path: Path) -> None:
    dev = FakeDevice()
    cb = _callback(dev, sample_every=1)
    _trainer([cb], tmp_path).fit(Tiny(dev), _loader(), _loader(2))
    sections = cb.throttle.stats.sections
    assert sections is not None and list(sections) == ["forward", "backward", "optimizer"]
    assert all(ms >= 0 for ms in sections.values()) and not cb.step_open and dev.syncs <= 3 * EPOCHS + 1
