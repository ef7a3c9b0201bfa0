"""``python -m asyncthrottle bench --values``: what keeping the loss on the host every step costs,
per backend.

On each backend present (JAX everywhere jax is installed, CUDA where there is a
GPU), at a tiny step and at a device-bound one, depth 2, the same jitted (or
torch) training step and batches, it times in interleaved rounds:

* ``defer``: ``Throttle(2)`` and ``thr.defer(loss, name="loss")`` every step,
  defaults, the loss written by an ``on_complete`` callback (on JAX's CPU
  backend ``wait="auto"`` is ``"spin-block"``: the host sleeps in the
  runtime's own wait, as MaxText's ``block_until_ready`` does; on CUDA it is
  ``"hybrid"``);
* ``defer-hybrid`` (JAX) or ``defer-block`` (CUDA): the same with the other
  wait: on JAX ``wait="hybrid"``, whose sleep slices and spin take the CPU
  from the device's threads when the device is the host's own cores; on CUDA
  ``wait="block"`` (blocking-sync events);
* ``float``: ``float(loss)`` (``loss.item()`` on CUDA) every step;
* ``maxtext``: MaxText's ``InflightThrottler``: a ``queue.Queue(maxsize=2)`` of
  ``(jax.tree.leaves(outputs), metrics)``; when full, the oldest is popped,
  ``block_until_ready``-ed, and its metrics written. On CUDA the same queue
  holds a ``torch.cuda.Event`` recorded after the step, synchronized on pop;
* ``by-hand``: the same rule written out in a few lines, no library: a
  ``collections.deque`` of the steps' losses (on CUDA, of an event recorded
  after each step with its loss); before a step, with 2 queued, the oldest is
  ``block_until_ready``-ed (synchronized) and written. MaxText's pattern
  without ``queue.Queue``'s locks or ``jax.tree.leaves``: the floor of what
  any throttle of this rule can cost, so ``defer`` against it is the
  library's own cost, and ``by-hand`` against ``maxtext`` is what the
  runtime does with a faster host (on JAX on the CPU, a tiny step's rounds
  split into fast and slow ones: ``benchmarks/jax_tiny_states.py``);
* ``plain``: no throttle, no metrics (asynchronous, unbounded).

On CUDA it then runs the first experiment's ``y = x + 1`` with ``y`` deferred every step
against the 15-line pooled-event reference that copies ``y`` into its own
pinned ring, at depth 1 and 2 (``bench.add_one_deferred``; the #26 target is
>= 0.92x of the reference).

Each time is the median of the rounds (the spread is min-max); each speed is the
median [min-max] of the per-round speeds against ``maxtext`` in the same round
(> 1: faster than MaxText's pattern), so that a drift of the machine between
rounds cancels out. ``cpu`` is the process's CPU time per step (every thread,
median of the rounds): on JAX on the CPU XLA's threads compute the steps on the
same cores, so a wait that spins or wakes often shows there. The outputs are
only the loss (MaxText's ``block_until_ready`` on donated parameters raises).
"""

from __future__ import annotations

import argparse
import platform
import queue
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from .._typed import command, examples
from ..throttle import Throttle
from .backends import _cuda_available, _jax_available

__all__ = ["MODES", "jax_loops", "main", "measure", "speeds"]

# the second mode is the other wait: "defer-hybrid" on JAX, "defer-block" on CUDA
MODES = ("defer", "defer-hybrid", "defer-block", "float", "maxtext", "by-hand", "plain")
# (label, width, batch, steps): a ~50 us and a ~1.5 ms step on the 2-core VM (docs/benchmarks.md)
JAX_SIZES = (("tiny", 32, 320, 3000), ("device-bound", 256, 512, 200))
CUDA_SIZES = (("tiny", 32, 320, 5000), ("device-bound", 2048, 8192, 400))
# x + 1 with y deferred (CUDA): steps a round
ADD_ONE_STEPS = 5000

Loop = Callable[[int], None]


def jax_mlp(width: int, batch: int) -> tuple[Callable[[Any], Any], Any]:
    """The values bench's JAX step (one hidden layer of ``width``, its parameters donated) and its
    first parameters."""
    import jax
    import jax.numpy as jnp

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (width, width)) * 0.1,
        "w2": jax.random.normal(k2, (width, 1)) * 0.1,
    }
    x = jax.random.normal(k3, (batch, width))
    y = jnp.sum(x, axis=1, keepdims=True)

    def loss_fn(p: Any) -> Any:
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    def train(p: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p)
        return jax.tree.map(lambda a, g: a - 1e-3 * g, p, grads), loss

    # the parameters are donated every step, as in training
    return jax.jit(train, donate_argnums=0), params


def jax_loops(width: int, batch: int,
              instrument: Callable[[Callable[[Any], Any]], Callable[[Any], Any]] | None = None
              ) -> dict[str, Loop]:
    """The JAX loops of the values bench by mode, on one step and parameters; ``instrument``, if
    given, wraps the jitted step in every loop alike (``benchmarks/jax_tiny_states.py``)."""
    import jax

    step, params = jax_mlp(width, batch)
    if instrument is not None:
        step = instrument(step)
    state = [step(params)[0]]
    jax.block_until_ready(state[0])  # type: ignore[no-untyped-call]
    logged: list[float] = []

    def plain(n: int) -> None:
        p = state[0]
        for _ in range(n):
            p, _ = step(p)
        jax.block_until_ready(p)  # type: ignore[no-untyped-call]
        state[0] = p

    def every(n: int) -> None:
        p = state[0]
        for _ in range(n):
            p, loss = step(p)
            logged.append(float(loss))  # host-device sync: the mode measured
        state[0] = p

    def maxtext(n: int) -> None:
        p = state[0]
        inflight: queue.Queue[tuple[list[Any], dict[str, Any]]] = queue.Queue(maxsize=2)

        def wait_for_next() -> None:
            outputs, metrics = inflight.get()
            jax.block_until_ready(outputs)  # type: ignore[no-untyped-call]  # host-device sync: the pattern measured
            logged.append(float(metrics["loss"]))

        for _ in range(n):
            if inflight.full():
                wait_for_next()
            p, loss = step(p)
            inflight.put((jax.tree.leaves(loss), {"loss": loss}))
        while not inflight.empty():
            wait_for_next()
        state[0] = p

    def by_hand(n: int) -> None:
        p = state[0]
        inflight: deque[Any] = deque()
        for _ in range(n):
            if len(inflight) == 2:
                oldest = inflight.popleft()
                oldest.block_until_ready()  # host-device sync: the pattern measured
                logged.append(float(oldest))
            p, loss = step(p)
            inflight.append(loss)
        while inflight:
            logged.append(float(inflight.popleft()))  # host-device sync: the loop's end
        state[0] = p

    def defer(n: int, wait: str = "auto") -> None:
        p = state[0]
        thr = Throttle(2, device="jax", wait=wait)
        thr.on_complete(lambda s, values: logged.append(float(values["loss"])))
        for _ in thr.wrap(range(n)):
            p, loss = step(p)
            thr.defer(loss, name="loss")
        jax.block_until_ready(p)  # type: ignore[no-untyped-call]
        state[0] = p

    return {
        "defer": defer, "defer-hybrid": lambda n: defer(n, "hybrid"), "float": every,
        "maxtext": maxtext, "by-hand": by_hand, "plain": plain,
    }


def _cuda_loops(width: int, batch: int) -> dict[str, Loop]:
    import torch

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w1 = torch.randn(width, width, device=dev, generator=gen) * 0.1
    w2 = torch.randn(width, 1, device=dev, generator=gen) * 0.1
    x = torch.randn(batch, width, device=dev, generator=gen)
    y = x.sum(1, keepdim=True)
    params = [w1.requires_grad_(), w2.requires_grad_()]
    logged: list[float] = []

    def step() -> Any:
        loss = ((torch.tanh(x @ params[0]) @ params[1] - y) ** 2).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(1e-3 * g)
        return loss.detach()

    def plain(n: int) -> None:
        for _ in range(n):
            step()
        torch.cuda.synchronize()  # host-device sync: the end of the measured loop

    def every(n: int) -> None:
        for _ in range(n):
            logged.append(step().item())  # host-device sync: the mode measured

    def maxtext(n: int) -> None:
        inflight: queue.Queue[tuple[Any, dict[str, Any]]] = queue.Queue(maxsize=2)

        def wait_for_next() -> None:
            event, metrics = inflight.get()
            event.synchronize()  # host-device sync: the pattern measured
            logged.append(metrics["loss"].item())

        for _ in range(n):
            if inflight.full():
                wait_for_next()
            loss = step()
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            inflight.put((event, {"loss": loss}))
        while not inflight.empty():
            wait_for_next()

    def by_hand(n: int) -> None:
        inflight: deque[tuple[Any, Any]] = deque()
        for _ in range(n):
            if len(inflight) == 2:
                event, loss = inflight.popleft()
                event.synchronize()  # host-device sync: the pattern measured
                logged.append(loss.item())
            loss = step()
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            inflight.append((event, loss))
        while inflight:
            logged.append(inflight.popleft()[1].item())  # host-device sync: the loop's end

    def defer(n: int, wait: str = "auto") -> None:
        thr = Throttle(2, device="cuda", wait=wait)
        thr.on_complete(lambda s, values: logged.append(float(values["loss"])))
        for _ in thr.wrap(range(n)):
            thr.defer(step(), name="loss")

    return {
        "defer": defer, "defer-block": lambda n: defer(n, "block"), "float": every,
        "maxtext": maxtext, "by-hand": by_hand, "plain": plain,
    }


def measure(loops: dict[str, Loop], steps: int, rounds: int,
            cpu: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Microseconds per step of each loop, one figure per round; rounds alternate the order.

    ``cpu``, if given, gets each round's process CPU microseconds per step (every thread: on JAX
    on the CPU, XLA's threads computing the steps too, so a wait that spins shows there).
    """
    for loop in loops.values():
        # warm: compilation, allocators, the first events
        loop(min(steps, 20))
    times: dict[str, list[float]] = {name: [] for name in loops}
    for r in range(rounds):
        order = list(loops) if r % 2 == 0 else list(reversed(loops))
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            loops[name](steps)
            times[name].append((time.perf_counter() - start) / steps * 1e6)
            if cpu is not None:
                cpu.setdefault(name, []).append((time.process_time() - start_cpu) / steps * 1e6)
    return times


def speeds(times: dict[str, list[float]], name: str, against: str = "maxtext") -> list[float]:
    """``name``'s speed against ``against`` in each round (their times in that round): > 1 is
    faster."""
    return [base / t for base, t in zip(times[against], times[name], strict=True)]


def _jax_here(asked: bool) -> bool:
    here = _jax_available()
    if asked and not here:
        raise RuntimeError("--backend jax needs jax: pip install 'asyncthrottle[jax]'")
    return here


def _cuda_here(asked: bool) -> bool:
    here = _cuda_available()
    if asked and not here:
        raise RuntimeError("--backend cuda needs torch and a CUDA GPU (torch.cuda.is_available() "
                           "is False here, or torch is not installed)")
    return here


def _backends(choice: str) -> list[str]:
    """The backends ``--backend choice`` runs here (``"auto"``: every one present); one asked for by
    name that is not here raises ``RuntimeError``."""
    names = list(_BACKENDS) if choice == "auto" else [choice]
    return [name for name in names if _BACKENDS[name][0](choice != "auto")]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=command("bench --values"), description=__doc__,
        epilog=examples(("bench --values", "every backend present"),
                        ("bench --values --backend jax --rounds 3", "JAX only, 3 rounds")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("auto", *_BACKENDS), default="auto",
                   help="auto: every backend present (JAX, and CUDA where there is a GPU)")
    p.add_argument("--rounds", type=int, default=9,
                   help="interleaved rounds per size (default 9; the median: a tiny step's rounds "
                        "spread by +-20 %% on a shared 2-core machine)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every size's step count (default 1)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.scale <= 0:
        p.error(f"--rounds must be >= 1 and --scale > 0, got {args.rounds} and {args.scale}")
    try:
        backends = _backends(args.backend)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not backends:
        print("bench --values: no backend here (needs jax, or torch with a CUDA GPU)")
        return 0
    print("asyncthrottle bench --values: the loss on the host every step, depth 2")
    print(f"machine: {platform.platform()}, Python {platform.python_version()}; {args.rounds} "
          "interleaved rounds; us/step median [min-max]; speed vs maxtext in the same round, "
          "median [min-max] (> 1: faster); cpu: the process's CPU per step, every thread, median")
    for backend in backends:
        _, sizes, make, after = _BACKENDS[backend]
        for label, width, batch, steps in sizes:
            n = max(1, round(steps * args.scale))
            cpu: dict[str, list[float]] = {}
            times = measure(make(width, batch), n, args.rounds, cpu)
            print(f"\n{backend}, {label} step (width {width}, batch {batch}, {n} steps):")
            for name in times:
                print(_row(name, times, "maxtext") + f"  cpu {statistics.median(cpu[name]):.0f} us")
        if after is not None:
            after(args.rounds, args.scale)
    return 0


def _row(name: str, times: dict[str, list[float]], against: str) -> str:
    """A table row: ``name``'s median time [range] and its speed against ``against``."""
    t, speed = times[name], speeds(times, name, against)
    return (f"  {name:12s} {statistics.median(t):9.1f} us [{min(t):.1f}-{max(t):.1f}]  "
            f"x{statistics.median(speed):.2f} [{min(speed):.2f}-{max(speed):.2f}]")


def _add_one_rows(rounds: int, scale: float) -> None:
    """``y = x + 1`` with ``y`` deferred every step against the 15-line pooled reference with its
    own pinned ring (``bench.add_one_deferred``), at depth 1 and 2."""
    import torch

    from ..backends.torch import resolve_events
    from .add_one_deferred import DEPTHS, add_one_loops

    device = torch.device("cuda")
    new_event = resolve_events(device)
    assert new_event is not None
    logged: list[float] = []
    loops = add_one_loops(device, new_event, {"device": device}, pin=True, logged=logged)
    n = max(1, round(ADD_ONE_STEPS * scale))
    times = measure(loops, n, rounds)
    print(f"\ncuda, y = x + 1 with y deferred every step ({n} steps), against the "
          "15-line pooled-event reference with its own pinned ring at the same depth (target "
          ">= 0.92):")
    for depth in DEPTHS:
        for name in (f"defer {depth}", f"reference {depth}"):
            print(_row(name, times, f"reference {depth}"))


# --backend's choices: whether each is here (raising why not when asked for by name), its step
# sizes, its loops, and what runs after them; a choice is looked up here, never compared
_BACKENDS: dict[str, tuple[Callable[[bool], bool], tuple[tuple[str, int, int, int], ...],
                           Callable[[int, int], dict[str, Loop]],
                           Callable[[int, float], None] | None]] = {
    "jax": (_jax_here, JAX_SIZES, jax_loops, None),
    "cuda": (_cuda_here, CUDA_SIZES, _cuda_loops, _add_one_rows),
}

if __name__ == "__main__":
    sys.exit(main())
