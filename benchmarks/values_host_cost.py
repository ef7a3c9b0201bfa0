"""Host CPU per step of keeping a JAX loss on the host: the throttle's Python beside MaxText's.

Run: ``.venv/bin/python benchmarks/values_host_cost.py [--rounds 5] [--steps 20000] [--bound]``.

``bench --values`` times real jitted steps, where the host shares the CPU with XLA's threads and a
figure moves by 10 % from run to run. This isolates the part of it that is the library's own: the
Python work per step of each pattern, as this thread's CPU time, on stand-in arrays that answer
``is_ready()`` like a step's output (not yet at the step's end, then ready) and convert to numpy
like a JAX array. No device work runs, so the figure is the same from run to run. Loops:

* ``maxtext``: MaxText's ``InflightThrottler`` pattern (a ``queue.Queue(maxsize=2)`` of
  ``(jax.tree.leaves(outputs), metrics)``, the oldest ``block_until_ready``-ed when full), the loss
  read with ``np.array`` (what the throttle reads it with; MaxText's ``float()`` of a real JAX array
  costs more);
* ``defer``: ``Throttle(2, device="jax")`` and ``thr.defer(loss, name="loss")`` every step, the loss
  written by an ``on_complete`` callback, defaults;
* ``defer, nonfinite=None`` and ``defer, sample_every=None``: the same without the non-finite watch
  or without device timing.

Each figure is the median over the rounds of the loop's microseconds per step over a bare loop that
makes the same stand-in arrays, beside the loop's Python and C calls a step over the bare loop's
(``sys.setprofile``'s ``call`` and ``c_call`` events: exact, the same on every run).

``--bound``: the same loops on a device-bound stand-in, an array unfinished until
``block_until_ready()``, so every step of every loop waits: the throttle's whole wait path, as the
default wait on JAX's CPU backend (``"spin-block"``) takes it on a device-bound step (it predicts a
long wait and sleeps in ``synchronize()``; ``SpinBlock(spin_s=0)`` here, since the stand-in has no
time in which a spin could see it finish).

``--metrics``: each step's value is a dict of three metrics (``loss``, ``mae``, ``grad_norm``), as
MaxText logs them: ``maxtext`` queues ``jax.tree.leaves`` of the dict and reads each metric,
``defer`` defers the dict (under the name ``"loss"``, as the loss alone is) and its callback
reads each.

``--sampling``: instead, ``defer`` at ``sample_every`` = 1, 2, 4, 8, 16 and 64 beside
``sample_every=None``, and what one sampled step costs: (per-step cost - unsampled cost) * k.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from _calls import calls_per_step  # (benchmarks/, this script's own folder)

from asyncthrottle import SpinBlock, Throttle


class StandInArray:
    """Answers like a step's JAX output: unfinished when first asked (the step's end), then
    ready."""

    __slots__ = ("asked", "value")

    def __init__(self, value: float) -> None:
        self.value, self.asked = value, 0

    def copy_to_host_async(self) -> None:
        pass

    def is_ready(self) -> bool:
        self.asked += 1
        return self.asked > 1

    def is_deleted(self) -> bool:
        return False

    def block_until_ready(self) -> StandInArray:
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return np.array(self.value, np.float32)


class BoundArray(StandInArray):
    """A device-bound step's output: unfinished until waited for (``block_until_ready``)."""

    __slots__ = ()

    def is_ready(self) -> bool:
        return self.asked > 0

    def block_until_ready(self) -> BoundArray:
        self.asked = 1
        return self


_EVERY = (1, 2, 4, 8, 16, 64)
# the stand-in the loops make (--bound: BoundArray)
_ARRAY: list[type[StandInArray]] = [StandInArray]
# --metrics: the names of a step's metrics (else one value, the loss)
_METRICS: list[tuple[str, ...]] = []


def _value() -> Any:
    """A step's output: the loss, or (--metrics) a dict of metrics."""
    array = _ARRAY[0]
    if _METRICS:
        return {name: array(1.0) for name in _METRICS[0]}
    return array(1.0)


def _read(value: Any) -> list[float]:
    """The numbers a logger writes of a step's delivered value (numpy arrays or stand-ins)."""
    if isinstance(value, dict):
        return [float(np.array(item)) for item in value.values()]
    return [float(np.array(value))]


def bare(n: int) -> None:
    for _ in range(n):
        _value()


def maxtext(n: int) -> None:
    logged: list[float] = []
    inflight: queue.Queue[tuple[list[Any], dict[str, Any]]] = queue.Queue(maxsize=2)

    def wait_for_next() -> None:
        outputs, metrics = inflight.get()
        jax.block_until_ready(outputs)  # type: ignore[no-untyped-call]
        logged.extend(_read(metrics["loss"]))

    for _ in range(n):
        if inflight.full():
            wait_for_next()
        loss = _value()
        inflight.put((jax.tree.leaves(loss), {"loss": loss}))
    while not inflight.empty():
        wait_for_next()


def throttled(**options: Any) -> Callable[[int], None]:
    def run(n: int) -> None:
        logged: list[float] = []
        bound: dict[str, Any] = {"wait": SpinBlock(spin_s=0.0)} if _ARRAY[0] is BoundArray else {}
        thr = Throttle(2, device="jax", **bound, **options)
        thr.on_complete(lambda step, values: logged.extend(_read(values["loss"])))
        for _ in thr.wrap(range(n)):
            thr.defer(_value(), name="loss")
        if len(logged) != n * max(1, len(_METRICS[0]) if _METRICS else 1):
            raise AssertionError(f"{len(logged)} numbers of {n} steps arrived")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--sampling", action="store_true",
                        help="the cost of one sampled step at sample_every = 1 .. 64")
    parser.add_argument("--bound", action="store_true",
                        help="a device-bound stand-in: every step waits (in synchronize())")
    parser.add_argument("--metrics", action="store_true",
                        help="each step's value is a dict of three metrics, not the loss alone")
    args = parser.parse_args()
    if args.bound:
        _ARRAY[0] = BoundArray
    if args.metrics:
        _METRICS.append(("loss", "mae", "grad_norm"))
    loops: dict[str, Callable[[int], None]] = {"bare": bare}
    if args.sampling:
        for every in _EVERY:
            loops[f"defer, sample_every={every}"] = throttled(sample_every=every)
        loops["defer, sample_every=None"] = throttled(sample_every=None)
    else:
        loops["maxtext"] = maxtext
        loops["defer"] = throttled()
        loops["defer, nonfinite=None"] = throttled(nonfinite=None)
        loops["defer, sample_every=None"] = throttled(sample_every=None)
    per_step: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            start = time.thread_time()
            loop(args.steps)
            per_step[name].append((time.thread_time() - start) / args.steps * 1e6)
    base = statistics.median(per_step["bare"])
    print(f"host CPU per step over a bare loop, us (median of {args.rounds} rounds [range], "
          f"{args.steps:,} steps); calls a step over the bare loop's, Python and C (exact)")
    bare_calls = calls_per_step(bare)
    unsampled = statistics.median(per_step["defer, sample_every=None"]) - base
    for name, values in per_step.items():
        if name != "bare":
            cost = statistics.median(values) - base
            python, c = calls_per_step(loops[name])
            line = (f"  {name:26s} {cost:6.2f} [{min(values) - base:.2f}..{max(values) - base:.2f}]"
                    f"  {python - bare_calls[0]:5.1f} py {c - bare_calls[1]:5.1f} C")
            period = name.rpartition("=")[2]
            if args.sampling and period.isdigit():
                line += f"  one sampled step: {(cost - unsampled) * int(period):5.1f}"
            print(line)


if __name__ == "__main__":
    main()
