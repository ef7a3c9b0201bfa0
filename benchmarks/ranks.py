"""Steps/s with straggler scores on and off: 2 gloo ranks, each on a GIL-free simulated device
(#19).

    python benchmarks/ranks.py [--steps 3000] [--step-ms 2] [--rounds 5] [--every 100]

Each round runs the same loop twice per rank, alternating scores off and on
(``ranks_every=None`` / ``ranks_every=N``); the ranks start each run together
(a barrier) and run without any other collective. Rank 0 prints the median
steps/s of each over the rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Sequence

import torch.distributed as dist
import torch.multiprocessing as mp

import asyncthrottle as at
from asyncthrottle.testing.simulated import ProcessDevice


def _run(dev: ProcessDevice, steps: int, step_s: float,
         every: int | None) -> tuple[float, at.Stats]:
    thr = at.Throttle(2, events=dev.event, ranks_every=every)
    dist.barrier()
    start = time.perf_counter()
    for _ in thr.wrap(range(steps)):
        dev.launch(step_s)
    return steps / (time.perf_counter() - start), thr.stats


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rates: dict[int | None, list[float]] = {None: [], args.every: []}
    with ProcessDevice() as dev:
        # warm-up (and the gather's group)
        _run(dev, 200, args.step_ms / 1000, args.every)
        for _ in range(args.rounds):
            for every in (None, args.every):
                rate, stats = _run(dev, args.steps, args.step_ms / 1000, every)
                rates[every].append(rate)
    if rank == 0:
        off, on = statistics.median(rates[None]), statistics.median(rates[args.every])
        print(f"machine: {os.cpu_count()} CPUs; {world} ranks (gloo), depth 2, {args.step_ms} ms "
              f"device steps, {args.steps} steps x {args.rounds} rounds")
        print(f"scores off: {off:.1f} steps/s   ranks_every={args.every}: {on:.1f} steps/s   "
              f"on/off {on / off:.2%}   (rank 0's scores at the end: {stats.rank_scores})")
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(_worker, args=(args.world, port, args), nprocs=args.world, join=True)  # type: ignore[attr-defined,no-untyped-call]


if __name__ == "__main__":
    main()
