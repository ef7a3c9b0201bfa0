"""A dict of metrics on the host every step, as MaxText logs them: ``defer(metrics)`` beside
MaxText's pattern, on a real jitted JAX step on the CPU.

Run: ``.venv/bin/python benchmarks/jax_metrics.py [--width 32] [--batch 320] [--steps 2000]
[--rounds 15]``.

The step is ``bench --values``' MLP (its parameters donated) returning three metrics (``loss``,
``mae``, ``grad_norm``); depth 2; interleaved rounds (``bench.values.measure``), each loop's speed
against ``maxtext`` in the same round, median [min-max]:

* ``maxtext``: MaxText's ``InflightThrottler`` pattern, a ``queue.Queue(maxsize=2)`` of
  ``(jax.tree.leaves(metrics), metrics)``, the oldest ``block_until_ready``-ed and each metric
  written with ``float``;
* ``by-hand``: the same rule in a few lines (a ``deque`` of the dicts);
* ``defer(dict)``: ``Throttle(2, device="jax")``, ``thr.defer(metrics, name="m")``, an
  ``on_complete`` callback writing each metric;
* ``defer each``: the same, each metric deferred under its own name.

Like ``bench --values``' tiny step, a round's figure moves with how XLA's threads and the host's
share the cores (``benchmarks/jax_tiny_states.py``); ``benchmarks/values_host_cost.py --metrics``
counts the library's own host work exactly.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp

from asyncthrottle import Throttle
from asyncthrottle.bench.values import measure, speeds


def loops(width: int, batch: int) -> dict[str, Any]:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (width, width)) * 0.1,
              "w2": jax.random.normal(k2, (width, 1)) * 0.1}
    x = jax.random.normal(k3, (batch, width))
    y = jnp.sum(x, axis=1, keepdims=True)

    def loss_fn(p: Any) -> Any:
        error = jnp.tanh(x @ p["w1"]) @ p["w2"] - y
        return jnp.mean(error ** 2), jnp.mean(jnp.abs(error))

    def train(p: Any) -> Any:
        (loss, mae), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        return (jax.tree.map(lambda a, g: a - 1e-3 * g, p, grads),
                {"loss": loss, "mae": mae, "grad_norm": norm})

    step = jax.jit(train, donate_argnums=0)
    state = [step(params)[0]]
    logged: list[float] = []

    def write(metrics: dict[str, Any]) -> None:
        logged.extend(float(value) for value in metrics.values())

    def maxtext(n: int) -> None:
        p = state[0]
        inflight: queue.Queue[tuple[list[Any], dict[str, Any]]] = queue.Queue(maxsize=2)

        def wait_for_next() -> None:
            outputs, metrics = inflight.get()
            jax.block_until_ready(outputs)  # type: ignore[no-untyped-call]  # host-device sync: the pattern measured
            write(metrics)

        for _ in range(n):
            if inflight.full():
                wait_for_next()
            p, metrics = step(p)
            inflight.put((jax.tree.leaves(metrics), metrics))
        while not inflight.empty():
            wait_for_next()
        state[0] = p

    def by_hand(n: int) -> None:
        p = state[0]
        inflight: deque[dict[str, Any]] = deque()
        for _ in range(n):
            if len(inflight) == 2:
                oldest = inflight.popleft()
                jax.block_until_ready(oldest)  # type: ignore[no-untyped-call]  # host-device sync: the pattern measured
                write(oldest)
            p, metrics = step(p)
            inflight.append(metrics)
        while inflight:
            write(inflight.popleft())  # host-device sync: the loop's end
        state[0] = p

    def deferred(n: int, each: bool) -> None:
        p = state[0]
        thr = Throttle(2, device="jax")
        thr.on_complete(lambda s, values: write(values if each else values["m"]))
        for _ in thr.wrap(range(n)):
            p, metrics = step(p)
            if each:
                for name, value in metrics.items():
                    thr.defer(value, name=name)
            else:
                thr.defer(metrics, name="m")
        jax.block_until_ready(p)  # type: ignore[no-untyped-call]  # host-device sync: the loop's end
        state[0] = p

    def checked(loop: Any) -> Any:
        def run(n: int) -> None:
            logged.clear()
            loop(n)
            if len(logged) != 3 * n:  # every metric of every step, once
                raise AssertionError(f"{len(logged)} metrics of {n} steps arrived")

        return run

    return {name: checked(loop) for name, loop in (
        ("maxtext", maxtext), ("by-hand", by_hand),
        ("defer(dict)", lambda n: deferred(n, False)), ("defer each", lambda n: deferred(n, True)))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=320)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {}
    times = measure(loops(args.width, args.batch), args.steps, args.rounds, cpu)
    print(f"JAX {jax.__version__} on {jax.default_backend()}, width {args.width}, batch "
          f"{args.batch}, {args.steps} steps x {args.rounds} rounds; us/step median [min-max], "
          "speed vs maxtext in the same round, process CPU per step")
    for name, spent in times.items():
        speed = speeds(times, name)
        print(f"  {name:12s} {statistics.median(spent):7.1f} [{min(spent):.1f}-{max(spent):.1f}]  "
              f"x{statistics.median(speed):.2f} [{min(speed):.2f}-{max(speed):.2f}]  "
              f"cpu {statistics.median(cpu[name]):.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
