"""What ``nonfinite="warn"`` (the default) costs a clean loop: the same deferred loop with the check
off and on.

Run: ``.venv/bin/python benchmarks/nonfinite.py [--rounds 9]``. In interleaved rounds, each loop
runs once with
``nonfinite=None`` and once with ``"warn"``; the figures are medians of the rounds (µs per step) and
the ratio
is the speed with the check over without it (1.0: free). Loops:

* ``jax-tiny``: JAX on the CPU, depth 2, a jitted ~50 µs step whose loss is deferred every step and
  written by
  an ``on_complete`` callback (the values bench's loop; there the check is part of its ``defer``
  mode);
* ``fake-float``: the FakeDevice, a Python float deferred every step (the throttle's own cost,
  nothing else);
* ``fake-torch``: the FakeDevice, a 0-d CPU torch tensor deferred every step;
* ``fake-dict``: the FakeDevice, a dict of a loss, a grad norm (0-d tensors) and an int step;
* ``fake-vector``: the FakeDevice, a CPU torch tensor of 8 floats deferred every step (per-layer
  gradient norms).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

from asyncthrottle import Throttle
from asyncthrottle.bench.values import jax_mlp
from asyncthrottle.testing import FakeDevice

# runs the loop with that nonfinite=, returns seconds per step
Loop = Callable[[str | None], float]


def jax_tiny(steps: int) -> Loop:
    import jax
    import jax.numpy as jnp

    step, params0 = jax_mlp(32, 320)
    jax.block_until_ready(step(jax.tree.map(jnp.copy, params0)))  # type: ignore[no-untyped-call]

    def run(nonfinite: str | None) -> float:
        params = jax.tree.map(jnp.copy, params0)
        thr = Throttle(2, device="jax", nonfinite=nonfinite)
        written: list[Any] = []
        thr.on_complete(lambda s, values: written.append(values["loss"]))
        start = time.perf_counter()
        for _ in thr.wrap(range(steps)):
            params, loss = step(params)
            thr.defer(loss, name="loss")
        return (time.perf_counter() - start) / steps

    return run


def fake(steps: int, make: Callable[[int], Any]) -> Loop:
    def run(nonfinite: str | None) -> float:
        dev = FakeDevice()
        thr = dev.throttle(2, nonfinite=nonfinite, sample_every=None)
        values = [make(i) for i in range(64)]
        start = time.perf_counter()
        for i in thr.wrap(range(steps)):
            dev.launch(1e-3)
            thr.defer(values[i % 64], name="loss")
        return (time.perf_counter() - start) / steps

    return run


def check_costs(values: dict[str, Any], repeat: int = 7, number: int = 20000) -> dict[str, float]:
    """The check alone, per step: the best of ``repeat`` timings of the watch's ``on_values`` on
    each value (us)."""
    import timeit

    from asyncthrottle._lifecycle import of
    from asyncthrottle.parts.nonfinite import NonFiniteWatch

    thr = Throttle(2, device="cpu")
    watch = NonFiniteWatch(of(thr).core, "warn")
    costs = {}
    for name, value in values.items():
        step = {"loss": value}
        best = min(timeit.repeat(lambda: watch.on_values(0, step), repeat=repeat, number=number))  # noqa: B023
        costs[name] = best / number * 1e6
    return costs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args(argv)
    loops: dict[str, Loop] = {}
    try:
        loops["jax-tiny"] = jax_tiny(args.steps)
    except ImportError:
        print("jax is not installed: jax-tiny left out")
    loops["fake-float"] = fake(args.steps, lambda i: 1.0 + i)
    try:
        import torch

        loops["fake-torch"] = fake(args.steps, lambda i: torch.tensor(1.0 + i))
        loops["fake-dict"] = fake(
            args.steps,
            lambda i: {"loss": torch.tensor(1.0 + i), "grad_norm": torch.tensor(0.5), "step": i},
        )
        loops["fake-vector"] = fake(args.steps, lambda i: torch.full((8,), 1.0 + i))
    except ImportError:
        print("torch is not installed: fake-torch, fake-dict and fake-vector left out")
    times: dict[tuple[str, str | None], list[float]] = {
        (name, m): [] for name in loops for m in (None, "warn")
    }
    # warm-up
    for loop in loops.values():
        loop(None), loop("warn")
    for r in range(args.rounds):
        for name, loop in loops.items():
            # interleaved, alternating order
            for mode in ((None, "warn") if r % 2 == 0 else ("warn", None)):
                times[(name, mode)].append(loop(mode))
    print(f"python {platform.python_version()}, {platform.machine()}, {args.rounds} rounds of "
          f"{args.steps} steps")
    print(f"{'loop':<12} {'off (us/step)':>14} {'warn (us/step)':>15} {'added (us)':>11} "
          f"{'speed':>7}")
    for name in loops:
        off = statistics.median(times[(name, None)]) * 1e6
        on = statistics.median(times[(name, "warn")]) * 1e6
        print(f"{name:<12} {off:>14.2f} {on:>15.2f} {on - off:>11.2f} {off / on:>6.3f}x")
    kinds: dict[str, Any] = {"float": 1.0}
    try:
        import numpy as np

        kinds |= {"numpy 0-d": np.float32(1.0), "numpy (1024,)": np.ones(1024, np.float32)}
    except ImportError:
        pass
    try:
        import torch

        kinds |= {
            "torch 0-d": torch.tensor(1.0),
            "torch (1024,)": torch.ones(1024),
            "dict of 2 + int": {
                "loss": torch.tensor(1.0), "grad_norm": torch.tensor(0.5), "step": 3,
            },
        }
    except ImportError:
        pass
    print("the check alone, per step (best of 7):")
    for name, cost in check_costs(kinds).items():
        print(f"  {name:<16} {cost:6.2f} us")


if __name__ == "__main__":
    main()
