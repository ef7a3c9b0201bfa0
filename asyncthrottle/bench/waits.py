"""``python -m asyncthrottle bench --waits``: each wait strategy's throughput, CPU and GIL cost.

On the GIL-free simulated device (:class:`~asyncthrottle.procdevice.ProcessDevice`)
or on CUDA (``--backend cuda``: ``torch.cuda._sleep`` kernels calibrated to the step
length), every wait runs at depth 1 and 2 over steps of 50 us to 10 ms, one op and
~5 us of host work per step. Reported per cell: steps/s (median of ``--repeats``
runs, with min-max), the ratio to ``"spin"`` in the same run, and the host thread's
CPU time as a share of spin's. A second table runs a Python thread that counts loop
iterations beside the throttled loop: the share of its solo rate it keeps, and the
loop's own throughput beside it.

It prints each row as it is measured, and caps its own run time: each timed run
stops after 4 times ``--run-s`` (a run slowed down by the counting thread's hold
on the GIL still ends), and no new row starts once ``--max-s`` is spent (the
rows left are counted as skipped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._typed import command, examples
from ..throttle import Throttle
from .report import Deadline, machine, say

__all__ = ["WAITS", "WaitBench", "main", "measure_thread", "measure_waits", "run_loop"]

WAITS = ("spin", "block", "poll", "hybrid", "spin-block")
STEPS_US = (50, 100, 300, 1000, 10000)
# a timed run stops after this many times its planned length
RUN_CAP = 4.0
Row = dict[str, Any]


class WaitBench(Protocol):
    """A device the wait sweep runs on: timed launches, a full sync, throttle options."""

    name: str

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of device work."""

    def synchronize(self) -> None:
        """Wait for all launched work."""

    def throttle_options(self) -> dict[str, Any]:
        """Keyword arguments that put a Throttle on this device (``events=`` or ``device=``)."""

    def close(self) -> None:
        """Release the device."""


class SimulatedWaitBench:
    """The GIL-free simulated device."""

    name = "simulated (child process, shared-memory completion; not a GPU)"

    def __init__(self) -> None:
        from ..testing.procdevice import ProcessDevice

        self.device = ProcessDevice()
        self.launch = self.device.launch

    def synchronize(self) -> None:
        self.device.synchronize()  # host-device sync: between runs

    def throttle_options(self) -> dict[str, Any]:
        return {"events": self.device.event}

    def close(self) -> None:
        self.device.close()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run_loop(bench: WaitBench, wait: str, depth: int, step_s: float, steps: int,
             host_s: float = 5e-6, warmup: int = 5,
             stop_at: float | None = None) -> dict[str, float]:
    """One timed throttled loop (after ``warmup`` untimed steps on the same throttle).

    It stops early at ``time.perf_counter() >= stop_at``; the rate is then over
    the steps it ran (``"steps"``, and ``"capped"`` is 1).
    """
    thr = Throttle(depth, wait=wait, **bench.throttle_options())
    bench.synchronize()  # host-device sync: each run starts on an idle device
    launch = bench.launch
    # lets a learning wait see a few waits first
    for _ in thr.wrap(range(warmup)):
        _spin(host_s)
        launch(step_s)
    done = 0
    cpu0, start = time.thread_time(), time.perf_counter()
    # drains at the end: a host-device sync on the last step
    for _ in thr.wrap(range(steps)):
        _spin(host_s)
        launch(step_s)
        done += 1
        if stop_at is not None and time.perf_counter() >= stop_at:
            break
    thr.drain()  # host-device sync: after a capped run's break (a no-op after a full pass)
    wall = time.perf_counter() - start
    return {
        "steps_per_s": done / wall, "cpu_s": time.thread_time() - cpu0, "wall_s": wall,
        "steps": done, "capped": float(done < steps),
    }


def _steps_for(step_s: float, run_s: float) -> int:
    return max(30, round(run_s / step_s))


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_waits(bench: WaitBench, *, waits: Sequence[str] = WAITS, depths: Sequence[int] = (1, 2),
                  steps_us: Sequence[float] = STEPS_US, repeats: int = 5, run_s: float = 0.15,
                  host_s: float = 5e-6, cap: Deadline | None = None,
                  on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """The sweep: one row per (depth, step, wait); runs of the waits interleave within each repeat.

    No cell starts once ``cap`` is spent; ``on_row`` hears each row as soon as it is measured.
    """
    cap = cap or Deadline(None)
    rows: list[Row] = []
    for depth in depths:
        for step_us in steps_us:
            if cap.spent():
                return rows
            step_s = step_us * 1e-6
            steps = _steps_for(step_s, run_s)
            runs: dict[str, list[dict[str, float]]] = {w: [] for w in waits}
            for _ in range(repeats):
                for wait in waits:
                    runs[wait].append(run_loop(bench, wait, depth, step_s, steps, host_s,
                                               stop_at=cap.at(RUN_CAP * run_s)))
            for row in _cells(runs, depth, step_us, steps):
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


def _cells(runs: dict[str, list[dict[str, float]]], depth: int, step_us: float,
           steps: int) -> list[Row]:
    """One row per wait of one (depth, step) cell, each against spin's median."""
    spin = runs.get("spin")
    spin_rate = statistics.median(r["steps_per_s"] for r in spin) if spin else float("nan")
    spin_cpu = statistics.median(r["cpu_s"] / r["wall_s"] for r in spin) if spin else float("nan")
    rows = []
    for wait, done in runs.items():
        rates = [r["steps_per_s"] for r in done]
        cpu = statistics.median(r["cpu_s"] / r["wall_s"] for r in done)
        rows.append({
            "depth": depth, "step_us": step_us, "wait": wait, "steps": steps,
            "capped_runs": int(sum(r["capped"] for r in done)),
            "steps_per_s": _summary(rates), "vs_spin": statistics.median(rates) / spin_rate,
            "ideal_steps_per_s": 1e6 / step_us, "host_cpu": cpu, "cpu_vs_spin": cpu / spin_cpu,
        })
    return rows


def _start_counter() -> tuple[float, threading.Thread, list[int]]:
    """Start a thread counting loop iterations; returns (start time, thread, [count, stop flag])."""
    box = [0, 0]

    def count() -> None:
        n = 0
        while not box[1]:
            n += 1
        box[0] = n

    thread = threading.Thread(target=count, name="asyncthrottle-bench-counter", daemon=True)
    start = time.perf_counter()
    thread.start()
    return start, thread, box


def _stop(start: float, thread: threading.Thread, box: list[int]) -> float:
    """Stop the counter; returns its iterations per second."""
    box[1] = 1
    thread.join()
    return box[0] / (time.perf_counter() - start)


def measure_thread(bench: WaitBench, *, waits: Sequence[str] = WAITS, depth: int = 2,
                   steps_us: Sequence[float] = (1000, 10000), repeats: int = 3, run_s: float = 0.3,
                   host_s: float = 5e-6, cap: Deadline | None = None,
                   on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """A counting Python thread beside the throttled loop: its share of its solo rate, and the
    loop's rate.

    The share is the median rate beside the loop over the median solo rate (solo: the host
    asleep in the kernel, the device idle), with each run's rate over that median as min-max.
    Each loop stops after ``RUN_CAP`` times ``run_s`` (the thread's hold on the GIL can slow it
    many times over); no cell starts once ``cap`` is spent.
    """
    cap = cap or Deadline(None)
    rows: list[Row] = []
    for step_us in steps_us:
        step_s = step_us * 1e-6
        steps = _steps_for(step_s, run_s)
        for wait in waits:
            if cap.spent():
                return rows
            solo, beside, loop, alone = [], [], [], []
            # interleaved, so that a noisy moment hits both sides
            for _ in range(repeats):
                alone.append(run_loop(bench, wait, depth, step_s, steps, host_s,
                                      stop_at=cap.at(RUN_CAP * run_s))["steps_per_s"])
                started = _start_counter()
                # the host idle in the kernel: the thread's solo rate
                time.sleep(run_s)
                solo.append(_stop(*started))
                started = _start_counter()
                loop.append(run_loop(bench, wait, depth, step_s, steps, host_s,
                                     stop_at=cap.at(RUN_CAP * run_s))["steps_per_s"])
                beside.append(_stop(*started))
            kept = [b / statistics.median(solo) for b in beside]
            row = {
                "depth": depth,
                "step_us": step_us,
                "wait": wait,
                "thread_kept": {
                    **_summary(kept), "median": statistics.median(beside) / statistics.median(solo),
                },
                "loop_steps_per_s": _summary(loop),
                "loop_alone_steps_per_s": _summary(alone),
            }
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def _waits_header(doc: dict[str, Any]) -> None:
    say(f"asyncthrottle bench --waits on {doc['backend']}")
    m = doc["machine"]
    say(f"machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}")
    say(f"median of {doc['repeats']} runs [min-max]; one op and ~5 us of host work per step")
    say(f"{'depth':>5} {'step':>7} {'wait':>7} {'steps/s':>9} {'[min-max]':>17} {'of ideal':>8} "
        f"{'vs spin':>8} {'host CPU':>8} {'CPU vs spin':>11}")


def _wait_row(r: Row) -> None:
    s = r["steps_per_s"]
    capped = f"  ({r['capped_runs']} runs capped)" if r.get("capped_runs") else ""
    say(f"{r['depth']:>5} {r['step_us']:>5g}us {r['wait']:>7} {s['median']:>9.0f} "
        f"{s['min']:>8.0f}-{s['max']:<8.0f} {s['median'] / r['ideal_steps_per_s']:>8.1%} "
        f"{r['vs_spin']:>8.1%} {r['host_cpu']:>8.0%} {r['cpu_vs_spin']:>11.0%}{capped}")


def _thread_header() -> None:
    say("a Python thread counting beside the loop: share of its solo rate kept, and the loop's "
        "steps/s")
    say(f"{'depth':>5} {'step':>7} {'wait':>7} {'thread kept':>11} {'[min-max]':>13} "
        f"{'loop steps/s':>12} {'alone':>7}")


def _thread_row(r: Row) -> None:
    k = r["thread_kept"]
    say(f"{r['depth']:>5} {r['step_us']:>5g}us {r['wait']:>7} {k['median']:>11.1%} "
        f"{k['min']:>6.1%}-{k['max']:<6.1%} {r['loop_steps_per_s']['median']:>12.0f} "
        f"{r['loop_alone_steps_per_s']['median']:>7.0f}")


def _skipped(what: str, done: int, planned: int, max_s: float | None) -> None:
    if done < planned:
        say(f"{what}: {planned - done} of {planned} rows skipped: the time cap (--max-s {max_s:g}) "
            "was spent")


def _run(bench: WaitBench, args: argparse.Namespace, doc: dict[str, Any]) -> None:
    """Measure both tables into ``doc``, printing rows as they come unless ``--json``."""
    cap = Deadline(args.max_s)
    live = not args.json
    if live:
        _waits_header(doc)
    doc["waits"] = measure_waits(bench, waits=args.strategies, steps_us=args.steps_us,
                                 repeats=args.repeats, run_s=args.run_s, cap=cap,
                                 on_row=_wait_row if live else None)
    if live:
        _skipped("wait sweep", len(doc["waits"]), 2 * len(args.steps_us) * len(args.strategies),
                 args.max_s)
    doc["thread"] = []
    if args.no_thread:
        return
    if live:
        _thread_header()
    doc["thread"] = measure_thread(bench, waits=args.strategies, repeats=max(3, args.repeats // 2),
                                   cap=cap, on_row=_thread_row if live else None)
    if live:
        _skipped("thread table", len(doc["thread"]), 2 * len(args.strategies), args.max_s)


def _cuda_sleep_bench() -> WaitBench:
    from .cuda_sleep import CudaSleepBench

    return CudaSleepBench()


# --backend: the device each choice times the waits on; a choice is looked up here, never compared
_BENCHES: dict[str, Callable[[], WaitBench]] = {"simulated": SimulatedWaitBench,
                                                "cuda": _cuda_sleep_bench}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the wait sweep and print a table (or ``--json``)."""
    p = argparse.ArgumentParser(
        prog=command("bench --waits"), description=__doc__,
        epilog=examples(("bench --waits", "every wait strategy, simulated steps"),
                        ("bench --waits --strategies spin,hybrid", "two of them")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=tuple(_BENCHES), default="simulated")
    p.add_argument("--strategies", type=lambda t: t.split(","), default=list(WAITS),
                   help="e.g. spin,hybrid")
    p.add_argument("--steps-us", type=lambda t: [float(x) for x in t.split(",")],
                   default=list(STEPS_US))
    p.add_argument("--repeats", type=int, default=5, help="runs per cell; the median is reported")
    p.add_argument("--run-s", type=float, default=0.15, help="seconds per timed run")
    p.add_argument("--no-thread", action="store_true", help="skip the concurrent-thread table")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--max-s", type=float, default=None,
                   help="stop starting new rows after this many seconds (default: no cap); skipped "
                        "rows are named")
    args = p.parse_args(argv)
    bad = [w for w in args.strategies if w not in WAITS]
    if bad or args.repeats < 1 or args.run_s <= 0 or min(args.steps_us) <= 0:
        p.error(f"--strategies must be a subset of {','.join(WAITS)}, --repeats >= 1, --run-s and "
                f"--steps-us > 0; got strategies={args.strategies}, repeats={args.repeats}, "
                f"run_s={args.run_s}, steps_us={args.steps_us}")
    if args.max_s is not None and not args.max_s > 0:
        p.error(f"--max-s must be a number of seconds > 0, got {args.max_s}; e.g. --max-s 60")
    try:
        bench = _BENCHES[args.backend]()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        doc: dict[str, Any] = {"backend": bench.name, "machine": machine(), "repeats": args.repeats,
                               "max_s": args.max_s}
        _run(bench, args, doc)
    finally:
        bench.close()
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
