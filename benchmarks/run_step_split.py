"""Where the time ``run`` adds to a training step goes (#44 point 9): the tiny step of
``run_calls.py`` timed in one process under each layer of the runner, interleaved round by round.

Each way's figure is the thread's CPU time a step (``time.thread_time``; the least of
``--repeats`` loops of ``--steps`` steps, after a warm-up), less plain's in the same round; the
table gives the median over ``--rounds`` rounds and its range, then (``least``) the least of all
its rounds and that less plain's least: on a machine whose neighbours come and go, load only ever
adds time, and the least is the figure to read when the rounds' range is wide. The ways:

- ``floor``: hooks at run's four places, doing nothing (``run_calls.floor_hooks``); with
  ``--floor``, also each place alone: ``forward hook`` (the armed global forward pre-hook and
  the optimizer post hook that re-arms it), ``backward wrapper``, ``optimizer hooks``;
- ``rules``: run's hooks and step rules, telling a throttle that does nothing (:class:`Idle`);
- ``run, no audit``: the same with run's throttle (observe only, as ``run`` makes it);
- ``run``: and the sync audit, as ``run`` installs it.

    python benchmarks/run_step_split.py [--loop step/tensors] [--rounds 5] [--repeats 3]
        [--steps 400] [--floor]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import run_calls  # (benchmarks/, this script's own folder)


class Idle:
    """Throttle hooks that do nothing: what run's step rules cost without the throttle's step."""

    class _Throttle:
        synchronous = True

        def pause(self, at: float | None = None) -> None:
            pass

    def __init__(self, device: Any = None) -> None:
        self.throttle, self.steps, self.step_open = self._Throttle(), 0, False

    def begin(self, number: int | None = None, at: float | None = None) -> int:
        self.steps += 1
        return self.steps

    def end(self, loss: Any = None, at: float | None = None) -> None:
        pass

    def fail(self) -> None:
        pass

    def phase(self, name: str, collective: bool = False) -> None:
        pass

    def end_phase(self) -> None:
        pass

    def drain(self) -> None:
        pass


Layer = Callable[[], AbstractContextManager[Any]]


def layers(optimizer: Any, *, floor: bool = False) -> dict[str, Layer]:
    """The ways to run the tiny step, by name: each a context manager in place while it runs
    (``floor``: also each of the floor's places alone)."""
    made: dict[str, Layer] = {"plain": nullcontext}
    if floor:
        for place, what in zip(run_calls.PLACES, ("hook", "wrapper", "hooks"), strict=True):
            made[f"{place} {what}"] = functools.partial(run_calls.floor_hooks, (place,))
    made["floor"] = run_calls.floor_hooks
    made["rules"] = functools.partial(run_calls.run_hooks, optimizer, audit=False, make=Idle)
    made["run, no audit"] = functools.partial(run_calls.run_hooks, optimizer, audit=False)
    made["run"] = functools.partial(run_calls.run_hooks, optimizer)
    made["run --events"] = functools.partial(run_calls.run_hooks, optimizer, record=True)
    return made


def check(runner: Any, trained: int) -> None:
    """A runner's way timed what it claims: its step rules opened a step for each step the loop
    trained (the last one still open)."""
    if runner is None:
        return
    hooks = runner.runner.hooks if runner.runner is not None else None
    opened = hooks.steps if isinstance(hooks, Idle) else (
        0 if hooks is None else hooks.throttle.stats.steps + 1)
    if opened != trained:
        raise SystemExit(f"the runner found {opened} steps of the {trained} the loop trained")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", default="step/tensors", choices=("step/tensors", "step/loader"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--floor", action="store_true",
                        help="also time each of the floor's places alone")
    args = parser.parse_args()
    made, optimizer = run_calls.loops()
    loop = made[args.loop]

    def timed(inside: Callable[[], AbstractContextManager[Any]]) -> float:
        with inside() as runner:
            loop(50)
            best: list[float] = []
            for _ in range(args.repeats):
                start = time.thread_time()
                loop(args.steps)
                best.append((time.thread_time() - start) / args.steps * 1e6)
            check(runner, 50 + args.repeats * args.steps)
        return min(best)

    ways = {name: functools.partial(timed, inside)
            for name, inside in layers(optimizer, floor=args.floor).items()}
    seen: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds):
        order = list(ways.items())
        for name, way in (order if round_ % 2 == 0 else order[::-1]):
            seen[name].append(way())
    print(f"{args.loop}: thread CPU µs a step, the median of {args.rounds} interleaved rounds "
          f"[range] of each round's difference to plain; the least of all rounds, and it less "
          f"plain's least")
    for name, values in seen.items():
        added = [value - plain for value, plain in zip(values, seen["plain"], strict=True)]
        least = min(values) - min(seen["plain"])
        print(f"  {name:16s} {statistics.median(values):8.1f}  added "
              f"{statistics.median(added):+7.1f} [{min(added):+.1f}..{max(added):+.1f}]   "
              f"least: {min(values):7.1f}, {least:+6.1f}")


if __name__ == "__main__":
    main()
