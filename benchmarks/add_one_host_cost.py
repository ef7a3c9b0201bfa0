"""Host cost per step of ``y = x + 1`` (the first experiment) with ``y`` deferred every step, as
the CUDA path takes it, on the CPU: the throttle's ``defer()`` beside the 15-line reference with its
own ring.

Run: ``.venv/bin/python benchmarks/add_one_host_cost.py [--rounds 11] [--steps 5000]``.

``bench --values --backend cuda`` measures #26's target for it (>= 0.92x of the reference) on a GPU.
Without one, this runs the same two loops (``asyncthrottle.bench.add_one_deferred``) on CPU tensors
whose snapshots are routed through the pinned ring as a CUDA tensor's are
(``snapshots.tensor_snapshot`` stood in for; the ring's buffers are plain CPU tensors, the stream
key a constant), with the CUDA backend's events around no-op ones (``TorchEvent`` in an
``EventPool``; the throttle's can be timed, so its device timing samples as on CUDA). So every
Python line and torch call of the deferred-tensor path runs: the ring copy (``copy_``), the copy
out of the ring at retirement (``clone``), the non-finite watch, the delivery to an ``on_complete``
callback that reads ``y[0, 0]``, as the reference reads its slot. What a CUDA call costs beyond its
CPU twin (a launch, a ``cudaMemcpyAsync``) is not here: both loops pay it alike, so on a GPU the
ratio is nearer 1 than here (how near: ``bench --values --backend cuda``).

Two figures per loop:

* **µs per step**, the loop thread's CPU time (``time.thread_time``: a preemption by another VM's
  work is not counted), median [min-max] of interleaved rounds, and the speed over the reference
  in each round (median [min-max]);
* **calls per step**: Python calls and C calls (``sys.setprofile``'s ``call`` and ``c_call``
  events) over 200 steps. These are exact: the same on every machine and every run, so a change to
  the path shows in them even where the machine's noise hides it in the times. Attribute reads of a
  tensor (``is_cpu``, ``nbytes``) and indexing are not calls and are not counted.
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from _calls import calls_per_step  # (benchmarks/, this script's own folder)

from asyncthrottle.backends import snapshots
from asyncthrottle.backends.pool import EventPool
from asyncthrottle.backends.torch import TorchEvent
from asyncthrottle.bench.add_one_deferred import add_one_loops
from asyncthrottle.bench.overhead import _NoopEvent, _TimedNoopEvent


def cuda_like(raw: type[Any]) -> EventPool:
    """An event factory as the CUDA backend's: a pool of ``TorchEvent`` around no-op events,
    recording on the current stream of the stand-in's device (-1, a CPU tensor's
    ``get_device()``)."""
    device_index = functools.partial(int, -1)
    return EventPool(lambda: TorchEvent(raw(), None, None, None, device_index))


NoopEvent, TimedNoopEvent = cuda_like(_NoopEvent), cuda_like(_TimedNoopEvent)

# snapshots that went into a ring slot
RINGED = [0]


def route_through_the_ring() -> None:
    """CPU tensors take the CUDA snapshot path: copied into a ring slot, out of it at retirement."""
    snapshots.TorchSnapshots.pin = lambda self, nbytes: torch.empty(nbytes, dtype=torch.uint8)  # type: ignore[method-assign]
    made = snapshots.TorchSnapshots.__init__

    def init(self: snapshots.TorchSnapshots, kind: str) -> None:
        made(self, kind)
        # a CPU tensor's get_device() is -1; one C call, like torch's for a CUDA tensor
        self.stream_key = {-1: (0, 0, 1)}.__getitem__

    snapshots.TorchSnapshots.__init__ = init  # type: ignore[method-assign]
    real = snapshots.tensor_snapshot

    def tensor_snapshot(tensor: Any, synchronous: bool, ring: Any) -> tuple[Any, bool]:
        if ring is not None and not synchronous:
            host = ring.copy(tensor.detach() if tensor.requires_grad else tensor, "cuda")
            if host is not None:
                RINGED[0] += 1
                return host, True
        return real(tensor, synchronous, ring)

    snapshots.tensor_snapshot = tensor_snapshot


OPTIONS: dict[str, dict[str, Any]] = {
    "defer": {},
    "defer, nonfinite=None": {"nonfinite": None},
    "defer, sample_every=None": {"sample_every": None},
    "defer, both off": {"nonfinite": None, "sample_every": None},
}


def make_loops(depth: int, logged: list[float]) -> dict[str, Callable[[int], None]]:
    loops = {"reference": add_one_loops(torch.device("cpu"), NoopEvent, {"events": NoopEvent},
                                        pin=False, logged=logged)[f"reference {depth}"]}
    for label, extra in OPTIONS.items():
        # the throttle's events can be timed, as CUDA's are: its device timing samples
        options = {"events": TimedNoopEvent, **extra}
        loops[label] = add_one_loops(torch.device("cpu"), NoopEvent, options, pin=False,
                                     logged=logged)[f"defer {depth}"]
    return loops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--depth", type=int, default=2)
    args = parser.parse_args(argv)
    route_through_the_ring()
    logged: list[float] = []
    loops = make_loops(args.depth, logged)
    for label, loop in loops.items():
        logged.clear()
        ringed = RINGED[0]
        loop(50)
        assert logged == [2.0] * 50, (label, logged[:4])  # every step's y, once, in order
        # the throttle's snapshots took the ring (a free slot every step)
        assert label == "reference" or RINGED[0] - ringed == 50, (label, RINGED[0] - ringed)
    times: dict[str, list[float]] = {label: [] for label in loops}
    for _ in range(args.rounds):
        for label, loop in loops.items():
            start = time.thread_time()
            loop(args.steps)
            times[label].append((time.thread_time() - start) / args.steps * 1e6)
            logged.clear()
    print(f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
          f"torch {torch.__version__}; x + 1 on CPU tensors through the ring, depth "
          f"{args.depth}, {args.steps} steps x {args.rounds} rounds")
    print(f"  {'loop':26s} {'us/step':>22s} {'speed vs reference':>24s} {'calls/step':>16s}")
    for label, loop in loops.items():
        spent = times[label]
        speed = [ref / mine for ref, mine in zip(times["reference"], spent, strict=True)]
        python, c = calls_per_step(loop)
        print(f"  {label:26s} {statistics.median(spent):7.2f} [{min(spent):.2f}-{max(spent):.2f}]"
              f"   x{statistics.median(speed):.2f} [{min(speed):.2f}-{max(speed):.2f}]"
              f"    {python:5.1f} py {c:5.1f} C")
    return 0


if __name__ == "__main__":
    sys.exit(main())
