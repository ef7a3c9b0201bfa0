"""The core's benchmark: per-step host overhead, and the cost of each wait strategy.

Run it as ``python -m asyncthrottle bench --overhead`` (or ``python -m
asyncthrottle.bench.overhead``). It prints, in one run on one machine:

* the per-step host overhead of a throttled loop over a bare loop on the same
  iterable, with the CPU (null) backend and with Python-level no-op events,
  beside the 15-line reference loop (:mod:`asyncthrottle.bench.reference`) on
  the same no-op events;
* the throughput of each wait strategy on the real-time, GIL-free simulated
  device at depth 1 and 2, with the host CPU time each one burns (the full
  sweep over step lengths is ``bench --waits``);
* how long a ``KeyboardInterrupt`` takes to arrive in a hung step's wait (hybrid and poll).

With ``--trace N`` it measures instead what ``Throttle(trace=N)`` adds per
step over the same throttle with ``trace=0``. With ``--backend cuda`` it
measures instead the per-step host cost on the GPU of the throttle (depth
None, 1 and 2; default options and ``sample_every=None``) beside the
reference loop on ``torch.Event`` at the same depth, in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from .._typed import command, examples
from ..core.events import EventFactory
from ..testing.procdevice import ProcessDevice
from ..throttle import Throttle
from .reference import Reference, generator_throttle

__all__ = [
    "main", "measure_beside", "measure_interrupt", "measure_overhead", "measure_trace",
    "measure_waits",
]


class _NoopEvent:
    """The cheapest possible Python-level event: always complete."""

    __slots__ = ()

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _TimedNoopEvent(_NoopEvent):
    """A no-op event that can be timed: exercises the telemetry's sampled device timing."""

    __slots__ = ()

    def elapsed_time(self, end: _TimedNoopEvent) -> float:
        return 0.0


def _best_loop_s(make_iterable: Callable[[], Iterable[Any]], repeats: int) -> float:
    """The least disturbed of ``repeats`` loops over ``make_iterable()``: this thread's CPU
    seconds."""
    best = float("inf")
    for _ in range(repeats):
        iterable = make_iterable()
        start = time.thread_time()
        for _item in iterable:
            pass
        best = min(best, time.thread_time() - start)
    return best


_OVERHEAD_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "null": lambda: {"device": "cpu"},
    "noop_events": lambda: {"events": _NoopEvent},
    "timed_events": lambda: {"events": _TimedNoopEvent},
    "timed_events_no_sampling": lambda: {"events": _TimedNoopEvent, "sample_every": None},
}


def _throttled(data: list[int], options: dict[str, Any], depth: int | None = 2) -> Iterable[int]:
    return Throttle(depth, **options).wrap(data)


def _medians(per_run: dict[str, list[float]]) -> dict[str, Any]:
    """Each case's median over the rounds (``<case>_us``) and its range (``<case>_range_us``)."""
    result: dict[str, Any] = {}
    for name, values in per_run.items():
        result[f"{name}_us"] = statistics.median(values)
        result[f"{name}_range_us"] = (min(values), max(values))
    return result


def _rounds(loops: dict[str, Callable[[], Iterable[Any]]], steps: int, runs: int, best_of: int,
            ratio_to: str | None = None) -> dict[str, Any]:
    """Per-step thread CPU us of each loop over the bare one: median and range of ``runs`` rotating
    rounds.

    With ``ratio_to``, also each loop's overhead over that loop's in the same round (``<name>_x``:
    the median of the per-round ratios, and ``<name>_range_x``).
    """
    names = list(loops)
    per_run: dict[str, list[float]] = {name: [] for name in names if name != "bare"}
    bare_us: list[float] = []
    for run in range(runs):
        shift = run % len(names)
        seconds = {
            name: _best_loop_s(loops[name], best_of) for name in names[shift:] + names[:shift]
        }
        bare_us.append(seconds["bare"] / steps * 1e6)
        for name in per_run:
            per_run[name].append((seconds[name] - seconds["bare"]) / steps * 1e6)
    ratios: dict[str, Any] = {}
    if ratio_to is not None:
        for name, values in per_run.items():
            per_round = [v / r for v, r in zip(values, per_run[ratio_to], strict=False) if r > 0]
            if per_round and name != ratio_to:
                ratios[f"{name}_x"] = statistics.median(per_round)
                ratios[f"{name}_range_x"] = (min(per_round), max(per_round))
    return {"steps": steps, "runs": runs, "best_of": best_of, "bare_us": statistics.median(bare_us),
            **_medians(per_run), **ratios}


def measure_overhead(
    steps: int = 300_000, runs: int = 7, best_of: int = 3, telemetry: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Microseconds per step that a throttled loop adds over a bare loop on the same list.

    Each of ``runs`` rounds times the bare loop and a depth-2 throttle on every
    backend, each the best of ``best_of`` loops (the least disturbed), in an
    order that rotates from round to round so that drift of the machine hits
    them all; times are this thread's CPU time, so other processes sharing the
    cores do not inflate them. Each figure is the median over the rounds of
    (throttled - bare) with its range. ``telemetry`` are extra Throttle options
    for every case (e.g. ``{"sample_every": 16}``).
    """
    data = list(range(steps))
    extra = telemetry or {}
    loops: dict[str, Callable[[], Iterable[Any]]] = {"bare": lambda: data}
    for name, case in _OVERHEAD_CASES.items():
        loops[name] = partial(_throttled, data, {**case(), **extra})
    # the hand-written loop, same events, depth 2
    loops["reference"] = lambda: Reference(data, _NoopEvent, 2)
    loops["generator"] = lambda: generator_throttle(data, _NoopEvent, 2)
    return _rounds(loops, steps, runs, best_of, ratio_to="generator")


def measure_beside(throttle_options: dict[str, Any], reference_events: EventFactory, *,
                   steps: int = 100_000, runs: int = 5, best_of: int = 3,
                   depths: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """Per-step host cost of the throttle beside the reference loop, on one backend, in the same
    rounds.

    Cases: ``throttle_none`` (depth None), and per depth ``d``: ``throttle_d``
    (default options), ``throttle_d_no_sampling`` (``sample_every=None``) and
    ``reference_d`` (the 15-line loop on ``reference_events``). The body is
    empty, so each figure is the pacing's own host cost (thread CPU time over
    a bare loop; see :func:`measure_overhead` for the rounds).
    """
    data = list(range(steps))
    loops: dict[str, Callable[[], Iterable[Any]]] = {
        "bare": lambda: data, "throttle_none": partial(_throttled, data, throttle_options, None)}
    for d in depths:
        loops[f"throttle_{d}"] = partial(_throttled, data, throttle_options, d)
        loops[f"throttle_{d}_no_sampling"] = partial(_throttled, data,
                                                     {**throttle_options, "sample_every": None}, d)
        loops[f"reference_{d}"] = partial(Reference, data, reference_events, d)
    return {"depths": depths, **_rounds(loops, steps, runs, best_of)}


def _cuda_beside(steps: int, runs: int) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("--backend cuda needs a CUDA GPU, but torch.cuda.is_available() is "
                           "False here")
    # what the issue's loop pools
    reference = partial(torch.Event, device=torch.device("cuda"), enable_timing=False)
    result = measure_beside({"device": "cuda"}, reference, steps=steps, runs=runs)
    torch.cuda.synchronize()  # host-device sync: the loops drained already; nothing is left
    return {"backend": f"cuda ({torch.cuda.get_device_name()})", **result}


# --backend: what measures the throttle beside the reference loop there (None: the whole run)
_BESIDE = {"cpu": None, "cuda": _cuda_beside}


def _print_beside(machine: str, result: dict[str, Any]) -> None:
    print(f"machine: {machine}; backend: {result['backend']}")
    print("host cost per step over a bare loop (empty body): thread CPU us, median of "
          f"{result['runs']} rounds [range], each the best of {result['best_of']} loops of "
          f"{result['steps']:,} steps")
    low, high = result["throttle_none_range_us"]
    print(f"  {'depth None':<10} throttle {result['throttle_none_us']:.3f} [{low:.3f}..{high:.3f}]")
    bare = result["bare_us"]
    for d in result["depths"]:
        ref = result[f"reference_{d}_us"]
        cells = []
        for label, key in (
            ("throttle", f"throttle_{d}"), ("sample_every=None", f"throttle_{d}_no_sampling"),
        ):
            # the loop's speed relative to the reference's: (bare + ref) / (bare + cost)
            cost = result[f"{key}_us"]
            cells.append(f"{label} {cost:.3f} us ({(bare + ref) / (bare + cost):.2f}x the "
                         "reference's speed)")
        print(f"  {'depth ' + str(d):<10} reference {ref:.3f} us; " + "; ".join(cells))


def _loop_cpu_s(thr: Throttle, data: list[int]) -> float:
    """The loop's CPU seconds on this thread: time-slicing by other processes on a shared machine is
    left out."""
    start = time.thread_time()
    for _item in thr.wrap(data):
        pass
    return time.thread_time() - start


def measure_trace(
    steps: int = 200_000, runs: int = 7, capacity: int = 10_000, best_of: int = 3
) -> list[dict[str, Any]]:
    """Microseconds per step that ``trace=capacity`` adds, per backend: median and range over
    ``runs``.

    Each run times the loop with ``trace=0`` and with ``trace=capacity``,
    each the best of ``best_of`` loops (the least disturbed), back to back in
    alternating order so that drift of the machine hits both; the figure is
    the median of the runs' differences, with their range. Times are the
    thread's CPU time (the loops never block), so other processes sharing
    the cores do not inflate them.
    """
    data = list(range(steps))
    backends: list[tuple[str, dict[str, Any]]] = [
        ("null backend (CPU)", {"device": "cpu"}),
        ("Python no-op events", {"events": _NoopEvent}),
        ("timeable no-op events", {"events": _TimedNoopEvent}),
    ]
    rows: list[dict[str, Any]] = []
    for label, options in backends:
        base: list[float] = []
        traced: list[float] = []
        for run in range(runs):
            order = (
                ((0, base), (capacity, traced)) if run % 2 == 0 else ((capacity, traced), (0, base))
            )
            for trace, out in order:
                best = min(
                    _loop_cpu_s(Throttle(2, trace=trace, **options), data) for _ in range(best_of)
                )
                out.append(best / steps * 1e6)
        added = sorted(t - b for b, t in zip(base, traced, strict=True))
        rows.append(
            {
                "backend": label, "runs": runs, "best_of": best_of, "steps": steps,
                "trace": capacity, "off_us": statistics.median(base),
                "on_us": statistics.median(traced), "added_us": statistics.median(added),
                "added_min_us": added[0], "added_max_us": added[-1],
            }
        )
    return rows


def _print_trace(rows: list[dict[str, Any]]) -> None:
    r0 = rows[0]
    print(f"machine: {_machine()}")
    print(f"trace={r0['trace']:,} over trace=0: thread CPU us/step, median of {r0['runs']} paired "
          f"runs (each the best of {r0['best_of']} loops of {r0['steps']:,} steps)")
    print(f"  {'backend':<24} {'trace=0':>8} {'trace=N':>8} {'added':>7}  {'range of added':>16}  "
          "(target <= 1)")
    for r in rows:
        print(f"  {r['backend']:<24} {r['off_us']:>8.3f} {r['on_us']:>8.3f} "
              f"{r['added_us']:>+7.3f}  {r['added_min_us']:>+7.3f}..{r['added_max_us']:<+7.3f}")


def _run_simulated(wait: str, depth: int | None, steps: int, device_s: float,
                   launch_s: float) -> dict[str, float]:
    with ProcessDevice(launch_s=launch_s) as device:
        thr = Throttle(depth, events=device.event, wait=wait)
        cpu0, start = time.thread_time(), time.perf_counter()
        for _ in thr.wrap(range(steps)):
            device.launch(device_s)
        wall = time.perf_counter() - start
        cpu = time.thread_time() - cpu0
    stats = thr.stats
    return {
        "steps_per_s": steps / wall, "host_cpu": cpu / wall, "max_in_flight": stats.max_in_flight,
    }


def measure_waits(
    steps: int = 400, device_s: float = 2e-3, launch_s: float = 1e-4, repeats: int = 3
) -> list[dict[str, Any]]:
    """Throughput of each wait strategy on the simulated device at depth 1 and 2 (best of
    ``repeats``)."""
    rows: list[dict[str, Any]] = []
    for depth in (1, 2):
        for wait in ("spin", "block", "poll", "hybrid"):
            runs = [_run_simulated(wait, depth, steps, device_s, launch_s) for _ in range(repeats)]
            best = max(runs, key=lambda run: run["steps_per_s"])
            rows.append({"depth": depth, "wait": wait, **best})
    for row in rows:
        spin = next(r for r in rows if r["depth"] == row["depth"] and r["wait"] == "spin")
        row["vs_spin"] = row["steps_per_s"] / spin["steps_per_s"]
    return rows


class _NeverEvent(_NoopEvent):
    __slots__ = ()

    def query(self) -> bool:
        return False


def measure_interrupt(wait: str = "hybrid", delay_s: float = 0.3) -> float:
    """Seconds from a real SIGINT to the KeyboardInterrupt in a ``wait`` on a hung step.

    After ``delay_s`` a waiting strategy is well into its sleeping phase (hybrid: 50 ms slices).
    """
    thr = Throttle(1, events=_NeverEvent, wait=wait)
    sent: list[float] = []

    def fire() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    # A process started in the background (`cmd &`, nohup) inherits SIGINT ignored: Ctrl-C's own
    # handler, for the measurement only.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(delay_s, fire)
    timer.start()
    try:
        for _ in thr.wrap(range(2)):
            pass
    except KeyboardInterrupt:
        return time.perf_counter() - sent[0]
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    raise RuntimeError(f"the {wait!r} wait returned on an event that never completes")


def _machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{platform.system()}")


def _print(result: dict[str, Any]) -> None:
    o = result["overhead"]
    print(f"machine: {result['machine']}")
    print(f"per-step overhead over a bare loop: thread CPU, median of {o['runs']} rounds [range] "
          f"(each the best of {o['best_of']} loops of {o['steps']:,} steps; bare loop "
          f"{o['bare_us']:.3f} us/step):")
    for name, label, target in (
        ("null", "null backend (CPU)", "(target <= 0.3)"),
        ("noop_events", "Python no-op events", ""),
        (
            "timed_events", "timeable no-op events",
            "(target <= 1: default telemetry, device timing on)",
        ),
        ("timed_events_no_sampling", "  same, sample_every=None", "(device timing off)"),
        ("reference", "15-line reference loop", "(no-op events, depth 2: the bar on CUDA)"),
        (
            "generator", "10-line generator",
            "(a new no-op event per step, depth 2: the bar on the CPU)",
        ),
    ):
        low, high = o[f"{name}_range_us"]
        print(f"  {label:<25} {o[name + '_us']:+.3f} us/step [{low:+.3f}..{high:+.3f}]  {target}")
    print("the same, over the 10-line generator in each round (median [range] of the per-round "
          "ratios):")
    for name, label, target in (
        ("noop_events", "Python no-op events", "(target <= 3: no device timing)"),
        ("timed_events_no_sampling", "timeable, sample_every=None", "(target <= 3)"),
        ("timed_events", "timeable no-op events", "(target <= 4: default telemetry)"),
    ):
        low, high = o[f"{name}_range_x"]
        print(f"  {label:<27} {o[name + '_x']:5.2f}x [{low:.2f}..{high:.2f}]  {target}")
    print("wait strategies on the simulated device (real time, GIL-free child process):")
    print(f"  {'depth':>5} {'wait':>6} {'steps/s':>9} {'vs spin':>8} {'host CPU':>9} "
          f"{'max in flight':>14}")
    for r in result["waits"]:
        print(f"  {r['depth']:>5} {r['wait']:>6} {r['steps_per_s']:>9.1f} {r['vs_spin']:>8.1%} "
              f"{r['host_cpu']:>9.0%} {r['max_in_flight']:>14}")
    latency = ", ".join(f"{wait} {ms:.2f} ms" for wait, ms in result["interrupt_ms"].items())
    print(f"Ctrl-C latency in a hung step's wait: {latency} (target < 100)")


def main(argv: list[str] | None = None) -> int:
    """Run the core's benchmark and print (or ``--json``) the figures."""
    parser = argparse.ArgumentParser(
        prog=command("bench --overhead"), description=__doc__, epilog=examples(
            ("bench --overhead --runs 3 --json", "3 rounds, as JSON"), ("bench --overhead", "")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300_000, help="steps of the overhead loops")
    parser.add_argument("--wait-steps", type=int, default=400, help="steps per wait-strategy run")
    parser.add_argument("--device-ms", type=float, default=2.0, help="simulated device ms per step")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--trace", type=int, metavar="N",
                        help="measure instead what trace=N adds per step")
    parser.add_argument("--runs", type=int, default=7,
                        help="rounds of the overhead loops (median and range)")
    parser.add_argument("--backend", choices=tuple(_BESIDE), default="cpu",
                        help="cuda: the throttle beside the reference loop on the GPU instead")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.wait_steps < 1 or args.runs < 1 or args.device_ms <= 0:
        parser.error("--steps, --wait-steps and --runs must be >= 1 and --device-ms > 0, got "
                     f"--steps {args.steps} --wait-steps {args.wait_steps} --runs {args.runs} "
                     f"--device-ms {args.device_ms}")
    measure_beside_on = _BESIDE[args.backend]
    if measure_beside_on is not None:
        try:
            beside = measure_beside_on(min(args.steps, 100_000), args.runs)
        except (ImportError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps({"machine": _machine(), **beside}, indent=2))
        else:
            _print_beside(_machine(), beside)
        return 0
    if args.trace is not None:
        if args.trace < 1 or args.runs < 1:
            parser.error(f"--trace and --runs must be ints >= 1, got --trace {args.trace} --runs "
                         f"{args.runs}")
        rows = measure_trace(min(args.steps, 100_000), args.runs, args.trace)
        print(json.dumps({"machine": _machine(), "trace": rows}, indent=2)) if args.json else (
            _print_trace(rows))
        return 0
    result = {
        "machine": _machine(),
        "overhead": measure_overhead(args.steps, args.runs),
        "waits": measure_waits(args.wait_steps, args.device_ms / 1000),
        "interrupt_ms": {wait: measure_interrupt(wait) * 1000 for wait in ("hybrid", "poll")},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
