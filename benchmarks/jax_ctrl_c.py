"""How soon Ctrl-C ends a wait for a long JAX step, per wait strategy (JAX on the CPU).

Run: ``.venv/bin/python benchmarks/jax_ctrl_c.py``.

A jitted program of about two seconds runs at depth 1; a SIGINT is sent 0.5 s into the wait
for it. ``"spin-block"`` (``wait="auto"`` on JAX's CPU backend) sleeps in ``block_until_ready``,
which looks for signals every 200 ms (jaxlib's ``BlockUntilReadyWithCancel``); ``"hybrid"``
sleeps in slices of at most 50 ms. Prints the seconds from the signal to the
``KeyboardInterrupt``, and where it was raised.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from typing import Any

import jax
import jax.numpy as jnp

import asyncthrottle as at


@jax.jit
def slow(x: Any) -> Any:
    return jax.lax.fori_loop(0, 1500, lambda i, a: jnp.tanh(a @ a.T / 512.0), x)


def main() -> None:
    x = jnp.ones((512, 512))
    slow(x).block_until_ready()  # compiled
    start = time.perf_counter()
    slow(x).block_until_ready()
    step_s = time.perf_counter() - start
    print(f"one step: {step_s:.2f} s; SIGINT 0.5 s into the wait")
    for wait in ("spin-block", "hybrid"):
        thr = at.Throttle(1, device="jax", wait=wait, stall=None)
        sent: list[float] = []

        def interrupt(sent: list[float] = sent) -> None:
            sent.append(time.perf_counter())
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(0.5, interrupt)
        timer.start()
        try:
            for _ in thr.wrap(range(3)):
                x = slow(x)
            print(f"  {wait:10s} not interrupted")
        except KeyboardInterrupt as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(f"  {wait:10s} KeyboardInterrupt {time.perf_counter() - sent[0]:.2f} s after the "
                  f"signal, in {where.name}()")
        timer.join()
        x.block_until_ready()


if __name__ == "__main__":
    main()
