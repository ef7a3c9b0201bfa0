"""Plain DDP on gloo, no accumulation: does ranks_every name the slow rank? Step times vs sections
(#27).

    python benchmarks/ddp_sections.py [--world 2] [--factor 2] [--steps 140] [--every 20]

Each rank trains the same MLP under ``DistributedDataParallel``; rank ``world - 1``
does ``factor`` times the compute (a batch ``factor`` times as large). Each
rank runs the loop twice: without sections (scores from step times, today's
behaviour) and with ``forward``/``backward`` (``collective=True``: it holds the
all-reduce)/``optimizer`` sections. Every rank prints the scores and the rank
it names.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import asyncthrottle as at


def _loop(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
          args: argparse.Namespace, sections: bool) -> at.Stats:
    thr = at.Throttle(2, device="cpu", ranks_every=args.every)
    for _ in thr.wrap(range(args.steps)):
        if sections:
            with thr.section("forward"):
                loss = model(x).square().mean()
            with thr.section("backward", collective=True):
                loss.backward()
            with thr.section("optimizer"):
                opt.step()
                opt.zero_grad()
        else:
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    return thr.stats


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = args.batch * (args.factor if rank == world - 1 else 1)
    x = torch.randn(int(batch), 256)
    result = {}
    for sections in (False, True):
        stats = _loop(model, opt, x, args, sections)
        result["sections" if sections else "steps"] = {
            "scores": stats.rank_scores, "slowest": stats.slowest_rank, "sections": stats.sections}
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    # every rank finishes before any tears the groups down (one leaving early aborts the others)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--factor", type=float, default=None,
                   help="the slow rank's compute (default 2, 3 with 4 ranks)")
    p.add_argument("--steps", type=int, default=140)
    p.add_argument("--every", type=int, default=20)
    p.add_argument("--batch", type=int, default=512,
                   help="the fast ranks' batch: large enough that compute dominates")
    p.add_argument("--out", default="/tmp/ddp_sections")
    args = p.parse_args(argv)
    if args.factor is None:
        args.factor = 2.0 if args.world <= 2 else 3.0
    os.makedirs(args.out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(_worker, args=(args.world, port, args, args.out), nprocs=args.world, join=True)  # type: ignore[attr-defined,no-untyped-call]
    slow = args.world - 1
    print(
        f"machine: {os.cpu_count()} CPUs; plain DDP, gloo, {args.world} ranks, rank {slow} "
        f"x{args.factor:g} compute, ranks_every={args.every}, {args.steps} steps, no accumulation"
    )
    ok = True
    for kind in ("steps", "sections"):
        for rank in range(args.world):
            seen = json.load(open(os.path.join(args.out, f"{rank}.json")))[kind]
            scores = seen["scores"]
            line = ", ".join(f"{s:.2f}" for s in scores)
            named = {k: round(v, 2) for k, v in (seen["sections"] or {}).items()}
            print(f"  {kind:8s} rank {rank}: names rank {seen['slowest']}; scores {line}"
                  + (f"; sections (ms) {named}" if named else ""))
            if kind == "sections":
                others = [s for r, s in enumerate(scores) if r != slow]
                ok &= (seen["slowest"] == slow and scores[slow] <= 0.75
                       and all(scores[slow] <= 0.8 * s for s in others))
                if args.world == 2:
                    ok &= all(s >= 0.8 for s in others)
    print("targets met (sections):", ok)


if __name__ == "__main__":
    main()
