"""The bench CLI and its parts: cost-model arithmetic, the mode runner on a fake device, the CLI end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import forked
import pytest

from asyncthrottle.bench import cli
from asyncthrottle.bench.backends import SimCost, SimulatedBench, pick_backend
from asyncthrottle.bench.cost_model import CostModel, measure_costs, solve_device_s
from asyncthrottle.bench.experiments import EXPERIMENTS, Experiment, run_experiment, run_mode
from asyncthrottle.bench.reference import Reference
from asyncthrottle.testing import FakeDevice

LAUNCH, DEVICE, SYNC = 1e-3, 3e-3, 0.5e-3


class FakeBench:
    """A BenchBackend on the deterministic fake device: each step costs the host ``launch`` and the device
    ``device``."""

    name = "fake"
    simulated = True

    def __init__(self, launch: float = LAUNCH, device: float = DEVICE, sync: float = SYNC) -> None:
        self.dev = FakeDevice()
        self.launch, self.device, self.sync = launch, device, sync

    def events(self) -> Callable[[], object]:
        return self.dev.event

    def synchronize(self) -> None:
        self.dev.synchronize()
        self.dev.host(self.sync)  # the round trip of an explicit sync

    def _op(self) -> Callable[[], None]:
        def step() -> None:
            self.dev.host(self.launch)
            self.dev.launch(self.device)

        return step

    add_one = train_step = _op

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        return self._op()

    def close(self) -> None:
        pass


# -- names -------------------------------------------------------------------


def test_the_bench_names_what_it_measures_not_the_projects_founding_brief() -> None:
    """"The seed" (the brief the project began from) means nothing to a reader: no module, name or
    docstring of the bench speaks of it (torch's ``manual_seed``, a random seed, is not that)."""
    folder = Path(cli.__file__).parent
    found = [f"{path.name}:{number}" for path in sorted(folder.glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if "seed" in path.name or "seed" in line.replace("manual_seed", "").lower()]
    assert not found, found


# -- the cost model ----------------------------------------------------------


def test_predict_is_d2ls_models_at_the_extremes() -> None:
    m = CostModel(launch_s=1.0, device_s=3.0, sync_s=2.0)
    assert m.predict(10, 1) == 10 * (1 + 3 + 2)  # sync: n (launch + device + sync)
    assert m.predict(10, None) == 1 + 10 * 3 + 2  # async: launch + n device + sync
    assert m.predict(0, None) == 0.0


def test_predict_host_bound_and_windows() -> None:
    host_bound = CostModel(launch_s=3.0, device_s=1.0, sync_s=2.0)
    assert host_bound.predict(10, None) == 10 * 3 + 1 + 2  # n launch + device + sync
    m = CostModel(launch_s=1.0, device_s=3.0, sync_s=8.0)
    assert m.predict(10, 2) == 10 * 6 + 1 + 8  # a window of 2 covers half of a 12 s round trip
    assert m.predict(10, 4) == 10 * 3 + 1 + 8  # wide enough: the device is the limit
    assert m.predict(10, 1000) == m.predict(10, None)


def test_solve_device_s_device_bound_and_host_bound() -> None:
    # device-bound: host launches 10 steps in 10 s; the device ends at launch + 10 device = 31, sync 2 s more
    assert solve_device_s(burst_s=10.0, drain_s=31 - 10 + 2, k=10, launch_s=1.0, sync_s=2.0) == pytest.approx(3.0)
    # host-bound: only the last step (0.5 s) is left when launching ends
    assert solve_device_s(burst_s=10.0, drain_s=0.5 + 2, k=10, launch_s=1.0, sync_s=2.0) == pytest.approx(0.5)
    assert solve_device_s(burst_s=10.0, drain_s=1.0, k=10, launch_s=1.0, sync_s=2.0) == 0.0
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        solve_device_s(1.0, 1.0, 0, 1.0, 1.0)


@pytest.mark.parametrize(("launch", "device"), [(LAUNCH, DEVICE), (DEVICE, LAUNCH)], ids=["device-bound", "host-bound"])
def test_measure_costs_recovers_the_fake_devices_costs(launch: float, device: float) -> None:
    bench = FakeBench(launch=launch, device=device)
    costs = measure_costs(bench, bench.add_one(), k=20, repeats=3, clock=bench.dev.clock)
    assert costs.launch_s == pytest.approx(launch)
    assert costs.device_s == pytest.approx(device)
    assert costs.sync_s == pytest.approx(SYNC)


# -- the mode runner on the fake device (exact, no sleeping) -----------------


def _run(mode: str, depth: int | None, steps: int = 20, sample: bool = False, bench: FakeBench | None = None):  # type: ignore[no-untyped-def]
    bench = bench if bench is not None else FakeBench()
    model = CostModel(LAUNCH, DEVICE, SYNC)
    wait = bench.dev.wait("spin")
    return run_mode(bench, bench.add_one(), steps, mode, depth, model, wait=wait, clock=bench.dev.clock, sample=sample)


def test_sync_mode_matches_the_sync_model_exactly() -> None:
    result = _run("sync", 1)
    assert result.wall_s == pytest.approx(result.predicted_s)
    assert result.max_in_flight == 1
    assert result.wait_fraction == pytest.approx((DEVICE + SYNC) / (LAUNCH + DEVICE + SYNC))


def test_async_and_throttled_modes_on_the_fake_device() -> None:
    n = 20
    unthrottled = _run("async", None, n)
    assert unthrottled.max_in_flight > 10  # the host ran far ahead
    assert unthrottled.wall_s == pytest.approx(LAUNCH + n * DEVICE)  # fake events sync for free: no sync cost
    depth2 = _run("depth 2", 2, n)
    assert depth2.max_in_flight == 2
    assert depth2.wall_s == pytest.approx(unthrottled.wall_s)  # depth 2 hides the waits entirely
    depth1 = _run("depth 1", 1, n)
    assert depth1.max_in_flight == 1
    assert depth1.wall_s == pytest.approx(n * (LAUNCH + DEVICE))


def test_timeline_samples_each_step_within_the_bound() -> None:
    result = _run("depth 2", 2, 12, sample=True)
    assert result.timeline is not None and len(result.timeline) == 12
    assert max(count for _, count in result.timeline) == 2
    times = [t for t, _ in result.timeline]
    assert times == sorted(times)


def test_run_experiment_keeps_every_mode() -> None:
    bench = FakeBench()
    exp = Experiment("add", "y = x + 1", 30, lambda backend: backend.add_one())
    clock = bench.dev.clock
    result = run_experiment(bench, exp, depths=(1, 3), scale=0.5, wait=bench.dev.wait("spin"), clock=clock)
    assert [r.mode for r in result.results] == ["sync", "async", "depth 1", "depth 3", "reference 1", "reference 3"]
    assert result.steps == 15 and result.costs.device_s == pytest.approx(DEVICE)
    assert result.by_mode("depth 3").max_in_flight == 3 == result.by_mode("reference 3").max_in_flight


def test_the_reference_loop_keeps_the_bound_and_reuses_its_events() -> None:
    n = 20
    bench = FakeBench()
    made: list[object] = []

    def counted() -> object:
        made.append(bench.dev.event())
        return made[-1]

    bench.events = lambda: counted  # type: ignore[method-assign,assignment,return-value]
    depth1 = _run("reference 1", 1, n, bench=bench)
    assert depth1.max_in_flight == 1 and len(made) == 2  # depth + 1 events, re-recorded in turn
    assert depth1.wall_s == pytest.approx(n * (LAUNCH + DEVICE))  # the same as the throttle at depth 1
    depth2 = _run("reference 2", 2, n, bench=bench, sample=True)
    assert depth2.max_in_flight == 2 and depth2.wall_s == pytest.approx(LAUNCH + n * DEVICE)  # hides the waits
    assert depth2.timeline is not None and max(count for _, count in depth2.timeline) == 2
    assert bench.dev.records == 2 * n and depth2.wait_s > 0
    with pytest.raises(ValueError, match="int depth >= 1"):
        Reference(range(3), bench.dev.event, 0)


# -- backends and the CLI (real time: structure only, never speed) -----------


def test_simulated_backend_rejects_unknown_workloads() -> None:
    with pytest.raises(ValueError, match="unknown simulated workloads"):
        SimulatedBench({"conv": SimCost(1e-6, 1e-6)})
    with pytest.raises(ValueError, match="launches >= 1"):
        SimCost(1e-6, 1e-6, 0)
    with pytest.raises(ValueError, match="--backend must be one of"):
        pick_backend("tpu")


FAST = ["--backend", "simulated", "--scale", "0.002", "--sim-cost", "add=1:20", "--sim-cost", "matmul=1:200",
        "--sim-cost", "train=1:50:2"]


def test_cli_json_on_the_simulated_device(capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.getswitchinterval()
    assert cli.main([*FAST, "--json", "--depths", "1,2", "--wait", "hybrid"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sys.getswitchinterval() == before  # the GIL-free device needs no switch-interval tuning
    assert doc["simulated"] is True and "simulated" in doc["backend"] and doc["wait"] == "hybrid"
    assert [e["key"] for e in doc["experiments"]] == [e.key for e in EXPERIMENTS]
    for exp in doc["experiments"]:
        modes = {m["mode"]: m for m in exp["modes"]}
        assert list(modes) == ["sync", "async", "depth 1", "depth 2", "reference 1", "reference 2"]
        assert modes["depth 1"]["max_in_flight"] <= 1 and modes["depth 2"]["max_in_flight"] <= 2
        assert modes["async"]["vs_async"] == 1.0
        assert all(m["wall_s"] > 0 and m["predicted_s"] > 0 for m in modes.values())
        assert set(exp["costs"]) == {"launch_s", "device_s", "sync_s"}


def test_cli_text_and_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    png = tmp_path / "inflight.png"
    assert cli.main([*FAST, "--experiments", "add", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out and "launch = host time" in out and "model err" in out and "depth 4" in out
    assert re.search(r"launch [\d.,]+ us, device [\d.,]+ us, sync [\d.,]+ us", out), out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depths", "0"], "depths must be ints >= 1"),
        (["--depths", "two"], "comma-separated ints"),
        (["--scale", "-1"], "expected a float > 0, got '-1'"),
        (["--repeat", "0"], "expected a int > 0"),
        (["--experiments", "conv"], "subset of add,matmul,train"),
        (["--sim-cost", "add=ten:5"], "NAME=HOST_US:DEVICE_US"),
        (["--backend", "tpu"], "invalid choice: 'tpu'"),
    ],
)
def test_cli_bad_values_name_the_value(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_unknown_sim_workload_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--backend", "simulated", "--sim-cost", "conv=1:2"]) == 2
    assert "unknown simulated workloads ['conv']" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--backend", "cuda"], ["--overhead", "--backend", "cuda"],
                                  ["--waits", "--backend", "cuda"], ["--values", "--backend", "cuda"]])
def test_cli_cuda_without_a_gpu_says_so(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cli.main(argv) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_overhead_flag_delegates(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncthrottle.bench import overhead

    seen: list[list[str] | None] = []
    monkeypatch.setattr(overhead, "main", lambda argv=None: seen.append(argv) or 0)
    assert cli.main(["--overhead", "--steps", "10", "--json"]) == 0
    assert seen == [["--steps", "10", "--json"]]


def test_module_entry_point_runs_bench() -> None:
    # (a fork of the suite's server runs ``-m`` as python does; torch imported once there)
    proc = forked.run(["-m", "asyncthrottle", "bench", *FAST, "--experiments", "add", "--json"],
                      text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["experiments"][0]["key"] == "add"
    proc = subprocess.run([sys.executable, "-m", "asyncthrottle"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "required: command" in proc.stderr


# -- the wait sweep (bench --waits): structure only, tiny sizes ---------------


def test_wait_sweep_reports_every_cell_against_spin() -> None:
    from asyncthrottle.bench import waits

    bench = waits.SimulatedWaitBench()
    try:
        rows = waits.measure_waits(bench, depths=(1, 2), steps_us=(100,), repeats=1, run_s=0.002)
        thread = waits.measure_thread(bench, waits=("spin", "hybrid"), steps_us=(100,), repeats=1, run_s=0.002)
    finally:
        bench.close()
    assert [(r["depth"], r["wait"]) for r in rows] == [(d, w) for d in (1, 2) for w in waits.WAITS]
    assert all(r["steps_per_s"]["min"] <= r["steps_per_s"]["median"] <= r["steps_per_s"]["max"] for r in rows)
    assert all(r["vs_spin"] == 1.0 and r["cpu_vs_spin"] == 1.0 for r in rows if r["wait"] == "spin")
    assert [r["wait"] for r in thread] == ["spin", "hybrid"]
    assert all(r["thread_kept"]["median"] > 0 and r["loop_steps_per_s"]["median"] > 0 for r in thread)


def test_waits_flag_delegates_and_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--waits", "--strategies", "spin,hybrid", "--steps-us", "200", "--repeats", "1", "--run-s", "0.003",
            "--no-thread"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "vs spin" in out and "hybrid" in out and "simulated" in out


def test_waits_bad_values_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--waits", "--strategies", "nap"])
    assert "got strategies=['nap']" in capsys.readouterr().err


def test_values_mode_runs_every_mode_at_tiny_scale(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("jax")
    assert cli.main(["--values", "--backend", "jax", "--rounds", "1", "--scale", "0.01"]) == 0
    out = capsys.readouterr().out
    for mode in ("defer", "defer-hybrid", "float", "maxtext", "by-hand", "plain"):
        assert f"  {mode} " in out
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(rows) == 12 and all(re.search(r"cpu \d+ us$", row) for row in rows)  # the process's CPU
    assert "tiny step" in out and "device-bound step" in out


@pytest.mark.parametrize("timed", [False, True])
def test_the_add_one_deferred_loops_deliver_every_step_in_order_at_each_depth(timed: bool) -> None:
    """``bench --values --backend cuda``'s x + 1 rows: the throttle's defer() and the 15-line
    reference with its own ring, here on CPU tensors and no-op events (pin=False)."""
    torch = pytest.importorskip("torch")
    from asyncthrottle.bench.add_one_deferred import DEPTHS, add_one_loops
    from asyncthrottle.bench.overhead import _NoopEvent, _TimedNoopEvent
    from asyncthrottle.bench.values import measure

    event = _TimedNoopEvent if timed else _NoopEvent
    logged: list[float] = []
    loops = add_one_loops(torch.device("cpu"), event, {"events": event}, pin=False, logged=logged)
    assert list(loops) == [f"{kind} {d}" for d in DEPTHS for kind in ("defer", "reference")]
    for loop in loops.values():
        logged.clear()
        loop(25)
        assert logged == [2.0] * 25  # y = x + 1 of ones, every step, once
    times = measure(loops, 10, 2)
    assert all(len(t) == 2 and min(t) > 0 for t in times.values())


class _RingEvent:
    """An event that completes only when synchronized: the reference must wait before it reads."""

    def __init__(self) -> None:
        self.done, self.records = True, 0

    def record(self) -> None:
        self.done = False
        self.records += 1

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_the_add_one_reference_reads_a_slot_only_after_its_event_and_reuses_its_events() -> None:
    torch = pytest.importorskip("torch")
    from asyncthrottle.bench.add_one_deferred import add_one_loops

    made: list[_RingEvent] = []

    def new_event() -> _RingEvent:
        made.append(_RingEvent())
        return made[-1]

    logged: list[float] = []
    loops = add_one_loops(torch.device("cpu"), new_event, {"events": new_event}, pin=False,
                       logged=logged)
    made.clear()
    loops["reference 2"](30)
    assert len(made) == 3 and sum(e.records for e in made) == 30  # depth + 1 events, re-recorded
    assert logged == [2.0] * 30 and all(e.done for e in made)


def test_values_speeds_are_per_round_ratios_against_maxtext() -> None:
    from asyncthrottle.bench.values import speeds

    times = {"maxtext": [10.0, 20.0, 40.0], "defer": [5.0, 40.0, 40.0]}
    assert speeds(times, "defer") == [2.0, 0.5, 1.0]  # each round against the same round's maxtext
    assert speeds(times, "maxtext") == [1.0, 1.0, 1.0]
