"""The benchmark scripts of ``benchmarks/``, the project's studies outside the wheel, still run (a short run of
each, in its own process or imported from the folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import forked
import pytest

from asyncthrottle.bench import cli

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))  # the scripts import as modules: autodepth, prefetch, jax_memory


def test_add_one_host_cost_runs_every_loop_through_the_ring_and_counts_calls() -> None:
    pytest.importorskip("torch")
    done = forked.run(
        [str(ROOT / "benchmarks" / "add_one_host_cost.py"), "--rounds", "1", "--steps", "50"],
        text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr  # its own checks: every value arrived, every defer took a ring slot
    lines = [line for line in done.stdout.splitlines() if line.startswith("  ") and " py " in line]
    rows = {line.split("  ")[1].strip(): line for line in lines}
    assert set(rows) == {"reference", "defer", "defer, nonfinite=None", "defer, sample_every=None", "defer, both off"}
    assert "3.0 py   6.0 C" in rows["reference"]  # exact: TorchEvent.record and its no-op event's two


@pytest.mark.parametrize("metrics", [False, True], ids=["the-loss", "a-dict-of-metrics"])
def test_values_host_cost_runs_and_counts_the_calls_of_each_loop(metrics: bool) -> None:
    pytest.importorskip("jax")
    done = forked.run(
        [str(ROOT / "benchmarks" / "values_host_cost.py"), "--rounds", "1", "--steps", "200",
         *(["--metrics"] if metrics else [])],
        text=True, timeout=300, preload=("jax",))
    assert done.returncode == 0, done.stderr  # its own check: every number of every step arrived
    rows = {line.split("  ")[1].strip(): line.split() for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(rows) == {"maxtext", "defer", "defer, nonfinite=None", "defer, sample_every=None"}
    python = float(rows["defer"][-4])  # "... <py> py <C> C"
    # the stand-ins call no JAX, so the counts are the library's own: a bound that one call more a
    # step (a slower walk or watch) breaks. Over half a call of slack: on a loaded machine a few
    # steps take another wait path (one call more a step on a tenth of the steps seen beside two
    # busy loops); 48.6 and 26.6 read with Core.record called from next() (a deferred value's part
    # hears the record: the core is not lean)
    assert python <= (49.2 if metrics else 27.2), done.stdout


def test_step_counts_holds_the_hot_path_to_its_python_calls() -> None:
    """A step of a wrapped loop is one frame (the core's StepIterator's next()) and its events'
    calls: one Python call more a step on the hot path fails here, where timings cannot see it."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_counts.py"), "--steps", "200"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    calls = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("  ")}
    assert calls["generator"] == 4.0  # (the 10-line generator: itself and its events' calls, exact)
    # next() and, on events, their record() and query(); device timing's sampled steps a quarter
    # call more (sample_every=8)
    assert (calls["null"], calls["noop_events"], calls["timed_events_no_sampling"]) == (1.0, 3.0, 3.0), done.stdout
    assert calls["timed_events"] <= 4.25, done.stdout


def test_jax_metrics_runs_every_loop_and_every_metric_arrives() -> None:
    pytest.importorskip("jax")
    done = forked.run(
        [str(ROOT / "benchmarks" / "jax_metrics.py"), "--steps", "30", "--rounds", "1"],
        text=True, timeout=300, preload=("jax",))
    assert done.returncode == 0, done.stderr  # its own check: 3 metrics a step arrived in every loop
    rows = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert rows == ["maxtext", "by-hand", "defer(dict)", "defer"]  # ("defer each" splits at its space)


# -- the studies that were bench flags: bench says where they went ---------------------------------


@pytest.mark.parametrize(("flag", "script"), [("--autodepth", "autodepth.py"), ("--prefetch", "prefetch.py")])
def test_a_bench_flag_whose_study_moved_names_the_script_to_run(
    flag: str, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([flag, "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert f"run python benchmarks/{script} --steps 10 from a clone of the source repository" in err, err


# -- benchmarks/autodepth.py: depth="auto" against fixed depths on the simulated device ------------


def test_autodepth_runs_from_its_script() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "autodepth.py"), "--loops", "device-bound", "--modes", "2,auto",
         "--steps", "10", "--repeat", "1"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "median of 1 runs" in done.stdout and "device-bound  auto" in done.stdout
    assert "device-bound  2" in done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loops", "spiky"], "--loops must be a comma-separated subset"),
        (["--modes", "0"], "modes are depths >= 1 or 'auto'"),
        (["--steps", "5"], "--steps must be >= 10"),
    ],
)
def test_autodepth_refuses_bad_options(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    import autodepth

    with pytest.raises(SystemExit):
        autodepth.main(argv)
    assert message in capsys.readouterr().err


# -- benchmarks/jax_memory.py: what JAX run-ahead holds, one process per mode ----------------------


@pytest.mark.jax
def test_jax_memory_measures_a_depth_and_a_budgeted_mode() -> None:
    pytest.importorskip("jax")
    import jax_memory

    row = jax_memory.measure_mode("2", steps=8, mib=1)
    assert row["mode"] == "2" and row["max_in_flight"] <= 1
    assert row["steps_per_s"] > 0 and row["peak_rss_mib"] >= row["growth_mib"] > -1
    row = jax_memory.measure_mode("8+mem", steps=6, mib=1, budget_mib=64)
    assert row["mode"] == "8+mem" and row["final_depth"] == 8 and row["budget_mib"] == 64
    assert row["steps_per_s"] > 0 and "probe_peak_growth_mib" in row and row["memory_waits"] >= 0
    auto = jax_memory.measure_mode("auto", steps=6, mib=1)
    assert auto["final_depth"] in (2, 3) and "budget_mib" not in auto


@pytest.mark.jax
def test_jax_memory_runs_each_mode_in_its_own_process() -> None:
    pytest.importorskip("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "jax_memory.py"), "--steps", "4", "--mib", "1", "--modes",
         "unthrottled,2", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [row["mode"] for row in json.loads(done.stdout)["rows"]] == ["unthrottled", "2"]


# -- benchmarks/prefetch.py: to= against apex's prefetcher and non_blocking copies ------------------


def test_prefetch_runs_every_mode_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import prefetch

    argv = ["--backend", "cpu", "--steps", "120", "--batch-mib", "0.05", "--repeat", "1", "--json"]
    assert prefetch.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["runs"]) == ["to", "non_blocking", "non_blocking_depth_none"]  # apex needs CUDA streams
    assert all(run["steps_per_s"] > 0 and run["ring_bytes"] == [0] for runs in doc["runs"].values() for run in runs)


def test_prefetch_on_cuda_without_a_gpu_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    import prefetch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert prefetch.main(["--backend", "cuda"]) == 2
    assert "--backend cuda needs a CUDA GPU" in capsys.readouterr().err


def _entering(calls: list[Any]) -> Callable[[Any], AbstractContextManager[None]]:
    """Stands in for ``torch.cuda.stream``: logs ("enter", the stream's name)."""

    @contextmanager
    def on(stream: Any) -> Iterator[None]:
        calls.append(("enter", stream.name))
        yield

    return on


def test_the_apex_style_prefetcher_copies_one_batch_ahead_on_a_side_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from prefetch import ApexPrefetcher

    calls: list[tuple[str, Any]] = []
    side = SimpleNamespace(name="side")
    compute = SimpleNamespace(name="compute", wait_stream=lambda s: calls.append(("wait_stream", s.name)))

    class DeviceTensor:
        def __init__(self, host: Any) -> None:
            self.host = host
            calls.append(("copy", int(host[0])))

        def record_stream(self, stream: Any) -> None:
            calls.append(("record_stream", stream.name))

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "stream", _entering(calls))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device, non_blocking: DeviceTensor(self))
    out = list(ApexPrefetcher([(torch.tensor([i]),) for i in range(3)], "cuda"))
    assert [int(batch[0].host[0]) for batch in out] == [0, 1, 2]
    assert calls[:6] == [("enter", "side"), ("copy", 0), ("wait_stream", "side"), ("record_stream", "compute"),
                         ("enter", "side"), ("copy", 1)]  # batch 1's copy is issued as batch 0 is handed out


# -- benchmarks/syncsites_cost.py and run_cost.py: what run's audit and run itself cost (#39) ------


def test_syncsites_cost_times_each_loop_and_the_audit_counts_only_the_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    import syncsites_cost

    # its own check: the audit counted every read of the read loops and nothing in the others
    assert syncsites_cost.main(["--calls", "20", "--rounds", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["loop"], row["reads"]) for row in rows] == [
        ("ops", False), ("x[int], x[slice]", False), ("to(dtype)", False), ("x[0].item()", True),
        ("x[mask]", True)]
    assert all(row["off_us"] > 0 and row["on_us"] > 0 for row in rows)


@pytest.mark.slow
@pytest.mark.timeout(900)  # three processes that import torch on a busy 2-core machine
def test_run_cost_runs_a_script_plain_and_under_run() -> None:
    # the plain loop alone: the MNIST example's command line is the next test's, and the example
    # itself runs in tests/tools/test_examples.py
    pytest.importorskip("torch")
    # (its two processes fresh interpreters, as the benchmark times them; no untimed warm-up one)
    done = forked.run([str(ROOT / "benchmarks" / "run_cost.py"), "--what", "plain", "--steps", "3",
                       "--rounds", "1", "--no-warm-up", "--json"], text=True, timeout=900)
    assert done.returncode == 0, done.stderr  # its own check: every process exited 0
    rows = json.loads(done.stdout)["rows"]
    assert [row["script"] for row in rows] == ["plain"]
    assert all(row["plain_s"] > 0 and row["run_s"] > 0 and row["ratio"] > 0 for row in rows)


def test_run_cost_s_mnist_command_is_one_the_example_takes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import run_cost

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import mnist
    finally:
        sys.path.remove(str(ROOT / "examples"))
    argv = run_cost.scripts(tmp_path, 7)["mnist"]
    assert argv[0] == str(ROOT / "examples" / "mnist.py")
    args = mnist.parse_args(argv[1:])
    assert (args.data, args.max_steps, args.epochs) == ("synthetic", 7, 1)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_cost_times_the_loops_of_a_step_and_of_an_evaluation_plain_and_under_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """#44's cost figures: the loop's own time, plain and under run, and run saw every step. The
    benchmark runs here; its loops' processes fork from the suite's server (they time their own
    loops, not their start: what a fresh interpreter changes is not in these figures)."""
    pytest.importorskip("torch")
    import run_cost
    import run_loop_cost

    def forks(argv: list[str], cwd: Path, tree: Path = ROOT) -> subprocess.CompletedProcess[str]:
        done = forked.run(argv, cwd=cwd, env=run_loop_cost.env(tree), timeout=900, text=True)
        assert done.returncode == 0, done.stderr
        return done

    monkeypatch.setattr(run_loop_cost, "process", forks)
    assert run_cost.main(["--what", "step,eval", "--rounds", "1", "--repeats", "1", "--loop-steps", "5",
                          "--batches", "3", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [row["loop"] for row in found["loops"]] == [
        "step/tensors", "step/loader", "eval/eval+no_grad", "eval/eval+inference_mode", "eval/no_grad"]
    assert found["report"]["steps"] == found["report"]["trained"] == 40
    assert all(row["wall"]["plain_us"] > 0 and row["wall"]["run_us"] > 0 for row in found["loops"])


@pytest.mark.timeout(600)
def test_run_calls_counts_run_s_calls_a_step_and_the_floor_s_exactly() -> None:
    pytest.importorskip("torch")
    done = forked.run([str(ROOT / "benchmarks" / "run_calls.py"), "--steps", "24"], text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step/tensors", "step/loader"]
    # the floor is exact and machine-free: 13 Python calls, 7 C calls a step
    assert all("(the floor of hooks at its places that do nothing: +13.0, +7.0)" in line for line in lines)


@pytest.mark.timeout(600)
def test_run_step_split_times_each_layer_of_the_runner_and_checks_its_steps() -> None:
    pytest.importorskip("torch")
    done = forked.run(
        [str(ROOT / "benchmarks" / "run_step_split.py"), "--rounds", "1", "--repeats", "1",
         "--steps", "10", "--floor"],
        text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr  # its own check: each runner found every step it timed
    ways = [line.split("  ")[1].strip() for line in done.stdout.splitlines()[1:]]
    assert ways == ["plain", "forward hook", "backward wrapper", "optimizer hooks", "floor", "rules",
                    "run, no audit", "run", "run --events"]


def test_run_instructions_runs_each_layer_s_steps_and_checks_them() -> None:
    # natively (--no-valgrind): the counted run imports torch under callgrind, over a minute alone;
    # what it adds, the dump files' totals, is read by _totals (the next test)
    pytest.importorskip("torch")
    if shutil.which("cc") is None or not Path("/usr/include/valgrind/callgrind.h").exists():
        pytest.skip("no callgrind.h or C compiler (apt-get install valgrind gcc)")
    done = forked.run([str(ROOT / "benchmarks" / "run_instructions.py"), "--steps", "3",
                       "--no-valgrind"], text=True, timeout=600)
    assert done.returncode == 0, done.stderr  # its own check: each runner found every step
    assert done.stdout == "step/tensors: each layer ran and found its 63 steps (not counted)\n"


def test_run_instructions_reads_each_callgrind_dump_s_total_in_order(tmp_path: Path) -> None:
    import run_instructions

    for number, total in ((2, 900), (1, 700), (10, 1200)):
        (tmp_path / f"cg.out.41.{number}").write_text(f"events: Ir\nsummary: {total}\n")
    assert run_instructions._totals(tmp_path) == [700, 900, 1200]
    (tmp_path / "cg.out.41.11").write_text("events: Ir\n")
    with pytest.raises(SystemExit, match=r"cg.out.41.11 holds no instruction count"):
        run_instructions._totals(tmp_path)


def test_run_cost_refuses_an_unknown_script(capsys: pytest.CaptureFixture[str]) -> None:
    import run_cost

    with pytest.raises(SystemExit):
        run_cost.main(["--scripts", "mnist,resnet"])
    assert "--scripts must be a comma-separated subset of mnist,plain, got 'mnist,resnet'" in capsys.readouterr().err
