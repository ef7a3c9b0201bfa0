"""What a section costs per step on the CPU with no-op events, beside the same loop without sections
(#27).

    python benchmarks/sections_overhead.py [--steps 200000] [--sections 3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import asyncthrottle as at

# sample_every (set by --sample-every)
EVERY = 1


class _Noop:
    __slots__ = ()

    def record(self) -> None: ...

    def query(self) -> bool:
        return True

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: object) -> float:
        return 0.001


def _run(steps: int, names: tuple[str, ...], held: bool = False) -> float:
    thr = at.Throttle(2, events=_Noop, sample_every=EVERY, stall=None)
    section = thr.section
    start = time.perf_counter()
    # the section objects made once, before the loop, and entered each step
    if held:
        made = [section(name) for name in names]
        for _ in thr.wrap(range(steps)):
            for one in made:
                with one:
                    pass
    else:
        for _ in thr.wrap(range(steps)):
            for name in names:
                with section(name):
                    pass
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--sections", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sample-every", type=int, default=1,
                   help="1: every step's sections timed (the worst case)")
    args = p.parse_args()
    global EVERY
    EVERY = args.sample_every
    names = tuple(f"s{i}" for i in range(args.sections))
    ref, with_sections, held = [], [], []
    for _ in range(args.rounds):
        ref.append(_run(args.steps, ()))
        with_sections.append(_run(args.steps, names))
        held.append(_run(args.steps, names, held=True))
    # the least disturbed round of each (a shared machine)
    r, s, h = min(ref), min(with_sections), min(held)
    print(f"no-op events, sample_every={EVERY}, {args.steps} steps x {args.rounds} rounds (best "
          "round of each)")
    print(f"reference: {r * 1e6:.2f} us/step   {args.sections} sections: {s * 1e6:.2f} us/step   "
          f"cost {(s - r) / args.sections * 1e6:.2f} us per section per step; sections made before "
          f"the loop: {(h - r) / args.sections * 1e6:.2f} us")


if __name__ == "__main__":
    main()
