"""Why a tiny JAX step's rounds split into fast and slow ones on a 2-core CPU: per round, what the
host's thread and XLA's threads did.

Run: ``.venv/bin/python benchmarks/jax_tiny_states.py [--rounds 9] [--steps 3000]``.

``bench --values``' tiny step (width 32, batch 320) on JAX's CPU backend, depth 2, three loops that
keep the loss on the host every step, in interleaved rounds, as ``bench --values`` runs them:
``maxtext`` (MaxText's ``InflightThrottler`` pattern), ``by-hand`` (the same rule in a few lines: a
deque of the losses, the oldest ``block_until_ready``-ed before a step when 2 are queued) and
``defer`` (``Throttle(2, device="jax")``, ``thr.defer(loss)``, defaults). Each round prints:

* ``us``: microseconds per step;
* ``dry``: the fraction of dispatches that found the step before already complete (the device had
  run out of work: one ``is_ready()`` a step, in every loop alike);
* ``preempted``: the loop thread's involuntary context switches (``/proc/self/task/<tid>/status``);
* ``xla sleeps``: the other threads' voluntary context switches, summed: XLA's pool threads (a
  worker that ran out of work and parked; they carry the process's name).

On the 2-core VM (docs/benchmarks.md): MaxText's host is slower than the device, every dispatch
finds the device dry (dry 0.99), and XLA's workers, spinning between steps, park about 30 times in
3000 steps. ``by-hand`` and ``defer`` are faster hosts: the device has work queued (dry 0.07-0.2)
and a round is fast (44 us against MaxText's 50) while the loop thread is not preempted; in a slow
round (55-100 us) it is preempted 150-300 times, as XLA's workers, parking and woken 300-550 times,
take the cores. The hand loop splits as the throttle does, so no host-side change of the throttle's
own makes the split go away.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncthrottle.bench.values import jax_loops


def _switches() -> dict[int, tuple[int, int]]:
    """Each thread of this process: its (voluntary, involuntary) context switches."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                lines = [line.split(":\t", 1) for line in f.read().splitlines()]
        except FileNotFoundError:
            continue
        fields = {pair[0]: pair[1] for pair in lines if len(pair) == 2}
        out[int(tid)] = (int(fields["voluntary_ctxt_switches"]),
                         int(fields["nonvoluntary_ctxt_switches"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    if not os.path.isdir("/proc/self/task"):
        print("needs Linux's /proc/self/task", file=sys.stderr)
        return 2
    dry: list[bool] = []

    def instrument(step: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """The step, noting whether the step before had completed when it is dispatched."""
        before: list[Any] = [None]

        def probed(p: Any) -> Any:
            dry.append(before[0] is not None and before[0].is_ready())
            out = step(p)
            before[0] = out[1]
            return out

        return probed

    every = jax_loops(32, 320, instrument)
    loops: dict[str, Callable[[int], None]] = {name: every[name]
                                                for name in ("maxtext", "by-hand", "defer")}
    for loop in loops.values():
        loop(20)  # compile, warm
    me = threading.get_native_id()
    rows: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in loops}
    print(f"JAX tiny step, depth 2, {args.steps} steps a round; us/step, dry fraction, loop thread "
          "preempted, XLA workers' sleeps")
    for r in range(args.rounds):
        for name in (loops if r % 2 == 0 else list(reversed(loops))):
            dry.clear()
            before = _switches()
            start = time.perf_counter()
            loops[name](args.steps)
            us = (time.perf_counter() - start) / args.steps * 1e6
            after = _switches()
            preempted = after[me][1] - before[me][1]
            # every other thread: XLA's pool (its threads carry the process's name), and the
            # throttle's stall watchdog, which sleeps in its waits' timeouts (seconds apart)
            sleeps = sum(after[t][0] - before[t][0] for t in after if t in before and t != me)
            rows[name].append((us, sum(dry) / len(dry), preempted, sleeps))
            print(f"  round {r}  {name:8s} {us:6.1f} us  dry {sum(dry) / len(dry):.2f}  "
                  f"preempted {preempted:4d}  xla sleeps {sleeps:4d}")
    print("median over the rounds [min-max]:")
    for name, got in rows.items():
        cols = list(zip(*got, strict=True))
        print(f"  {name:8s} " + "  ".join(
            f"{label} {statistics.median(c):.2f} [{min(c):.2f}-{max(c):.2f}]"
            for label, c in zip(("us", "dry", "preempted", "xla sleeps"), cols, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
