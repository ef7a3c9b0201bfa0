"""Scripts of each style run unchanged under ``python -m asyncthrottle run``: the same stdout and exit
code as under plain python, the right steps, every loss, and the sync lines they contain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from _runs import SharedRuns, found_syncs, report_loader, said_syncs, start, under_run

# script, its steps, the steps whose loss is NaN/Inf, and the DataLoader that feeds its loop
STYLES = [
    ("loader_loop.py", 8, [], report_loader(6)),
    ("accumulation.py", 4, [], report_loader(4)),
    ("get_batch.py", 6, [], None),
    ("manual_sgd.py", 5, [], None),
    ("lbfgs.py", 3, [], None),
    ("grad_scaler.py", 5, [2], None),
    # the producer thread's next() is not the loop's wait, and its loader is not the loop's
    ("thread_loader.py", 4, [], None),
    # a batch whose optimizer step raised (caught, skipped) is no step; detection goes on
    ("caught_step_error.py", 9, [], report_loader(4)),
    # preprocessing in the body and a read before the forward are the step's
    ("body_work.py", 12, [], report_loader(4)),
    # an evaluation with grad on (no eval(), no no_grad) between steps is no step
    ("eval_with_grad.py", 6, [], report_loader(8)),
    # a dataset's nn.Module transform is the loader's work; its reads and a logger's are no syncs
    ("transforms_logger.py", 12, [], report_loader(4)),
    # a teacher's forward under no_grad, with no loader, begins the step it trains in
    ("distill_no_loader.py", 8, [], None),
    # reentrant checkpointing: a backward() inside the step's backward() is the step's own work
    ("reentrant_checkpoint.py", 6, [], None),
    # two tasks in turn, each forward at its own line: each step begins at its forward
    ("alternating_tasks.py", 8, [], None),
    # a host schedule read every step is no sync; a module's buffers read every update are
    ("schedule_ema.py", 8, [], None),
]


# where a script writes its losses under run (its shared run's folder)
_LOSSES = "{folder}/run.txt"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("script", "steps", "nonfinite", "loader"), STYLES)
def test_a_script_runs_as_under_python_and_its_steps_losses_and_syncs_are_found(
        script: str, steps: int, nonfinite: list[int], loader: dict[str, Any] | None,
        tmp_path: Path, shared_runs: SharedRuns) -> None:
    # both at once: each is a few seconds of importing torch (the run under run is shared: other
    # tests read it too)
    started = start(script, str(tmp_path / "plain.txt"))
    done, report, folder = shared_runs.run(script, _LOSSES)
    plain = started.wait()
    assert plain.returncode == 0, plain.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
    # the script's own output, byte for byte, and its own losses (same seed)
    assert done.stdout == plain.stdout
    kept = json.loads((folder / "run.txt").read_text())
    assert kept == json.loads((tmp_path / "plain.txt").read_text())
    assert report["schema"] == 1 and report["steps"] == steps == len(kept)
    assert report["nonfinite"] == nonfinite
    # the JSON's null where the loss is NaN/Inf
    assert [step for step, v in enumerate(report["losses"]) if v is None] == nonfinite
    finite = [value for step, value in enumerate(kept) if step not in nonfinite]
    assert [v for v in report["losses"] if v is not None] == pytest.approx(finite, rel=1e-6)
    assert found_syncs(report) == said_syncs(script)
    assert f"asyncthrottle run: {script}: {steps} steps" in done.stderr.decode()
    assert report["loader"] == loader
    assert (report["input_wait_s"] > 0) == (loader is not None)
    # the loader's wait is within what the throttle counts between steps (gradient accumulation
    # also takes a batch inside its step)
    if script != "accumulation.py":
        assert report["input_wait_s"] <= report["stats"]["fetch_s"] * 1.01 + 1e-4, report["stats"]
    if script in ("distill_no_loader.py", "alternating_tasks.py"):
        # each step after the first began at its teacher's (or its own) 3 ms forward (a lower
        # bound: load only adds)
        assert min(report["per_step"]["step_s"][1:]) >= 0.003, report["per_step"]



def _run_both(script: str, tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    started = start(script, str(tmp_path / "plain.json"))
    done, report = under_run(script, tmp_path, str(tmp_path / "run.json"))
    plain = started.wait()
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout
    assert (tmp_path / "run.json").read_text() == (tmp_path / "plain.json").read_text()
    return json.loads((tmp_path / "run.json").read_text()), report


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_gan_s_batch_is_one_step_and_each_optimizer_has_its_loss_series(
        tmp_path: Path) -> None:
    kept, report = _run_both("gan.py", tmp_path)
    assert report["steps"] == len(kept["d"]) == 5
    series = report["losses_by_optimizer"]
    assert list(series) == ["optimizer 0 (Adam)", "optimizer 1 (SGD)"]
    assert series["optimizer 0 (Adam)"] == pytest.approx(kept["d"], rel=1e-6)
    assert series["optimizer 1 (SGD)"] == pytest.approx(kept["g"], rel=1e-6)
    # the step's loss: every backward() of the batch
    total = [d + g for d, g in zip(kept["d"], kept["g"], strict=True)]
    assert report["losses"] == pytest.approx(total, rel=1e-6)
    assert found_syncs(report) == said_syncs("gan.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_backward_with_signs_and_backward_of_several_losses_give_the_loss_autograd_takes(
        tmp_path: Path) -> None:
    """``err_real.backward(one)``, ``err_fake.backward(mone)``: the critic's loss is their difference;
    ``torch.autograd.backward([a, b])``: the generator's is their sum."""
    kept, report = _run_both("wgan_signs.py", tmp_path)
    assert report["steps"] == len(kept["d"]) == 5
    critic, generator = report["losses_by_optimizer"].values()
    assert critic == pytest.approx(kept["d"], rel=1e-5, abs=1e-7)
    assert generator == pytest.approx(kept["g"], rel=1e-5, abs=1e-7)
    assert found_syncs(report) == said_syncs("wgan_signs.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_fine_tuning_s_new_optimizer_has_its_own_steps_and_the_first_keeps_its_own(
        tmp_path: Path) -> None:
    kept, report = _run_both("finetune.py", tmp_path)
    first, second = kept["first"], kept["second"]
    assert report["steps"] == len(first) + len(second) == 7
    assert report["losses"] == pytest.approx(first + second, rel=1e-6)
    series = report["losses_by_optimizer"]
    assert list(series) == ["optimizer 0 (SGD)", "optimizer 1 (Adam)"]
    sgd, adam = series.values()
    assert sgd[3:] == [None] * 4 and sgd[:3] == pytest.approx(first, rel=1e-6)
    assert adam[:3] == [None] * 3 and adam[3:] == pytest.approx(second, rel=1e-6)
    assert found_syncs(report) == said_syncs("finetune.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_optimizer_made_anew_each_epoch_is_one_optimizer(tmp_path: Path) -> None:
    """The same class over the same parameters, made again each epoch (its learning rate reset): the
    report of a one-optimizer loop, not a series an epoch."""
    kept, report = _run_both("optimizer_per_epoch.py", tmp_path)
    assert report["steps"] == len(kept) == 12
    assert report["losses"] == pytest.approx(kept, rel=1e-6)
    assert "losses_by_optimizer" not in report
    assert found_syncs(report) == said_syncs("optimizer_per_epoch.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_f_string_of_ints_and_a_loss_is_one_read_and_its_suggestion_names_the_loss(
        tmp_path: Path) -> None:
    started = start("fstring_log.py")
    done, report = under_run("fstring_log.py", tmp_path)
    plain = started.wait()
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert done.stdout == plain.stdout and report["steps"] == 6
    assert found_syncs(report) == said_syncs("fstring_log.py")
    (row,) = report["syncs"]
    assert row["fields"] == [2]
    assert report["suggestions"][0].startswith("fstring_log.py:16 calls f'{loss}' every step")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wgan_s_generator_update_every_third_batch_is_part_of_that_batch_s_step(
        tmp_path: Path) -> None:
    kept, report = _run_both("wgan_gp.py", tmp_path)
    critic, gen = kept["critic"], kept["gen"]
    assert report["steps"] == len(critic) == 9 and len(gen) == 3
    series = report["losses_by_optimizer"]
    assert list(series) == ["optimizer 0 (Adam)", "optimizer 1 (Adam)"]
    assert series["optimizer 1 (Adam)"][0::3] == pytest.approx(gen, rel=1e-6)
    assert [v for k, v in enumerate(series["optimizer 1 (Adam)"]) if k % 3] == [None] * 6
    assert series["optimizer 0 (Adam)"] == pytest.approx(critic, rel=1e-6)
    assert found_syncs(report) == said_syncs("wgan_gp.py")


def test_a_one_optimizer_report_has_no_series_by_optimizer(shared_runs: SharedRuns) -> None:
    """(the JSON of a one-optimizer loop is as before; the run is the one its style's test
    reads)"""
    done, report, _ = shared_runs.run("manual_sgd.py", _LOSSES)
    assert done.returncode == 0, done.stderr.decode()
    assert report and "losses_by_optimizer" not in report


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_spawned_workers_starting_and_joining_are_not_the_loop_s_time(tmp_path: Path) -> None:
    """Each epoch's first next() starts the workers (seconds, spawned) and its last one joins
    them: neither is loop time nor input wait."""
    kept, report = _run_both("spawn_workers.py", tmp_path)
    assert report["steps"] == len(kept) == 16
    assert report["losses"] == pytest.approx(kept, rel=1e-6)
    # the loop's time without the workers' start and join: a small part of the script's own
    seconds = float((tmp_path / "run.json.seconds").read_text())
    assert report["stats"]["wall_s"] < 0.3 * seconds, (report["stats"], seconds)
    assert report["input_wait_s"] < report["stats"]["wall_s"]
