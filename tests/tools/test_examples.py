"""The MNIST examples end to end on synthetic data on the CPU: they learn, they fail clearly, DDP runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import forked
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

torch = pytest.importorskip("torch")
common = pytest.importorskip("_mnist_common")
mnist = pytest.importorskip("mnist")

FAST = ["--data", "synthetic", "--device", "cpu", "--no-progress", "--batch-size", "32"]


def _env() -> dict[str, str]:
    # The scripts import the package of this checkout, not whichever one is installed (a worktree's venv).
    path = os.pathsep.join(p for p in (str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}


@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang guard: a busy 2-core machine takes minutes, not seconds
def test_mnist_learns_on_synthetic_data() -> None:
    lines: list[str] = []
    result = mnist.train(mnist.parse_args([*FAST, "--max-steps", "40", "--epochs", "2", "--seed", "1"]),
                         log=lines.append)
    losses = [value for _, value in result["losses"]]
    assert [step for step, _ in result["losses"]] == list(range(80))  # every step logged, in order
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10  # the loss falls
    assert result["accuracies"][-1] > 0.5  # chance is 0.1
    assert result["stats"].steps == 80 and result["data"] == "synthetic"
    assert any(line.startswith("asyncthrottle: 80 steps") for line in lines)  # thr.summary() at the end


def test_auto_data_falls_back_to_synthetic_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(data_dir: str, download: bool) -> Any:
        raise RuntimeError(f"MNIST is not in {data_dir!r} and could not be downloaded: no network")

    monkeypatch.setattr(common, "real_mnist", offline)
    lines: list[str] = []
    data = common.load_data("auto", "nowhere", seed=0, log=lines.append)
    assert data.source == "synthetic"
    assert "could not be downloaded" in lines[0] and "falling back to SYNTHETIC" in lines[1]
    with pytest.raises(RuntimeError, match="could not be downloaded"):
        common.load_data("mnist", "nowhere", seed=0)


def test_synthetic_data_is_deterministic_and_mnist_shaped() -> None:
    a, b = common.synthetic_mnist(256, 64, seed=3), common.synthetic_mnist(256, 64, seed=3)
    x, y = a.train.tensors
    assert x.shape == (256, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(x, b.train.tensors[0]) and torch.equal(y, b.train.tensors[1])
    assert set(y.tolist()) == set(range(10))
    assert not torch.equal(x, common.synthetic_mnist(256, 64, seed=4).train.tensors[0])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depth", "0"], "--depth must be an int >= 1, 'auto' or 'none', got '0'"),
        (["--depth", "two"], "--depth must be an int >= 1, 'auto' or 'none', got 'two'"),
        (["--epochs", "0"], "--epochs must be a int > 0, got '0'"),
        (["--lr", "-0.1"], "--lr must be a float > 0, got '-0.1'"),
        (["--batch-size", "x"], "--batch-size must be a int > 0, got 'x'"),
        (["--workers", "-1"], "--workers must be an int >= 0, got '-1'"),
        (["--max-steps", "0"], "--max-steps must be a int > 0"),
        (["--data", "cifar"], "invalid choice: 'cifar'"),
    ],
)
def test_bad_options_name_the_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        mnist.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_depth_none_and_devices() -> None:
    assert mnist.parse_args(["--depth", "none"]).depth is None
    assert mnist.parse_args([]).depth == 2
    with pytest.raises(SystemExit, match="not a device torch knows"):
        common.resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match=r"torch.cuda.is_available\(\) is False"):
            common.resolve_device("cuda")


@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang guard: a busy 2-core machine takes minutes, not seconds
def test_mnist_script_runs_with_a_progress_bar(tmp_path: Path) -> None:
    proc = forked.run(
        [str(EXAMPLES / "mnist.py"), "--data", "synthetic", "--max-steps", "15", "--epochs", "1",
         "--depth", "1"],
        text=True, timeout=600, cwd=tmp_path, env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1: 15 steps" in proc.stdout and "test accuracy" in proc.stdout
    assert "asyncthrottle: 15 steps" in proc.stdout
    assert "loss=" in proc.stderr  # the tqdm postfix shows the deferred loss


@pytest.mark.slow
@pytest.mark.timeout(600)  # a hang guard: a busy 2-core machine takes minutes, not seconds
def test_ddp_two_processes_gloo(tmp_path: Path) -> None:
    proc = forked.run(
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(EXAMPLES / "ddp_mnist.py"), *FAST, "--max-steps", "12", "--epochs", "1"],
        text=True, timeout=600, cwd=tmp_path, env=_env(),
        # torchrun's agent hosts the job's store and starts the ranks: a fresh interpreter, as
        # users start it, not a fork of the suite's server
        fresh=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "world=2 backend=gloo" in out
    assert "rank 0: 12 steps" in out and "rank 1: 12 steps" in out
    assert "asyncthrottle across 2 ranks (depth=2): 24 steps, 24 seen complete" in out
    assert "test accuracy" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ddp_straggle_names_the_slow_rank_in_plain_ddp(tmp_path: Path) -> None:
    """No --accumulate: every step all-reduces, yet the sections' own work names rank 1 on both ranks.

    Its own work takes 4x (at 2x a busy 2-core machine's noise, on the CPU's host clock, named rank 0
    about one run in four)."""
    proc = forked.run(
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(EXAMPLES / "ddp_mnist.py"), *FAST, "--max-steps", "60", "--epochs", "1", "--straggle", "1:4"],
        text=True, timeout=600, cwd=tmp_path, env=_env(),
        # torchrun's agent hosts the job's store and starts the ranks: a fresh interpreter, as
        # users start it, not a fork of the suite's server
        fresh=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0: slowest rank 1 " in proc.stdout and "rank 1: slowest rank 1 " in proc.stdout, proc.stdout


def test_ddp_refuses_to_run_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    ddp = pytest.importorskip("ddp_mnist")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="run this under torchrun"):
        ddp.main(FAST)


def test_width_widens_the_model_and_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert mnist.parse_args([]).width == 1
    narrow, wide = common.Net(), common.Net(4)
    count = lambda net: sum(p.numel() for p in net.parameters())  # noqa: E731
    assert count(narrow) < 30_000 < 5 * count(narrow) < count(wide)
    assert wide(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(SystemExit):
        mnist.parse_args(["--width", "0"])
    assert "--width must be a int > 0, got '0'" in capsys.readouterr().err


def test_a_large_batch_run_has_enough_synthetic_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # the least synthetic set made small (as 16384 is to 4096-sample batches): 5 x 32 samples need
    # more than it holds
    monkeypatch.setattr(mnist, "SYNTHETIC_TRAIN", 64)
    lines: list[str] = []
    args = mnist.parse_args([*FAST, "--width", "1", "--max-steps", "5", "--epochs", "1"])
    result = mnist.train(args, log=lines.append)
    assert result["stats"].steps == 5  # 5 x 32 samples: more than the 64 made at least
    assert any("width=1" in line for line in lines)


def test_ddp_hang_is_parsed_and_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    ddp = pytest.importorskip("ddp_mnist")
    assert ddp.parse_args(["--hang", "1:30:5"]).hang == (1, 30, 5.0)
    for bad in ("1:30", "a:1:2", "1:2:0", "-1:2:3", "1:2:3:4"):
        with pytest.raises(SystemExit):
            ddp.parse_args(["--hang", bad])
        assert "--hang" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--hang needs a CUDA GPU"):
        ddp.hang_device(torch.device("cpu"))
