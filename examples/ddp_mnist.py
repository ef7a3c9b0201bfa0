"""Train the MNIST CNN with DistributedDataParallel, each rank throttling its own loop.

    torchrun --nproc_per_node=2 examples/ddp_mnist.py              # one machine, 2 processes
    torchrun --nproc_per_node=8 examples/ddp_mnist.py --depth 2    # 8 GPUs: NCCL, one GPU per rank
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 \\
        --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 --rdzv_id=mnist examples/ddp_mnist.py
    torchrun --nproc_per_node=2 examples/ddp_mnist.py --straggle 1:2    # name the slow rank (plain
    DDP)
    torchrun --nproc_per_node=2 examples/ddp_mnist.py --hang 1:30:5     # GPUs: every rank reports
    the stall

NCCL on GPUs, gloo on CPUs. A throttle is per process and needs nothing from
the others: each rank bounds its own host's run-ahead. At the end, one
all-gather collects every rank's statistics and rank 0 prints them, reduced:
counts and seconds are summed over ranks, ``max_in_flight`` and ``wall_s`` are
the maximum over ranks, and the host-wait share is summed wait over summed wall.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

# for _mnist_common when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _mnist_common import Net, add_training_options, evaluate, load_data

import asyncthrottle as at

# default steps per epoch and rank without GPUs
CPU_MAX_STEPS = 100
SUMMED = ("steps", "completed", "waits", "wait_s", "fetch_s", "body_s")
MAXED = ("max_in_flight", "wall_s")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_options(p)
    p.add_argument("--straggle", type=straggle, default=None, metavar="RANK:FACTOR",
                   help="slow one rank on purpose: its steps take FACTOR times as long (extra host "
                        "time)")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="gradient accumulation: all-reduce every K steps (DDP no_sync() between)")
    p.add_argument("--ranks-every", type=int, default=None, metavar="N",
                   help="gather the ranks' median step times every N steps and name the slowest "
                        "(default: 20 with --straggle, else off)")
    p.add_argument("--stall", type=float, default=None, metavar="SECONDS",
                   help="report a wait for one step that lasts this long (default: 'auto'; with "
                        "--hang, half the hang)")
    p.add_argument("--hang", type=hang, default=None, metavar="RANK:STEP:SECONDS",
                   help="GPUs only: at STEP, keep rank RANK's device busy for SECONDS (one "
                        "spinning kernel), so every rank's throttle reports the stall (its rank, "
                        "step and stacks)")
    return p.parse_args(argv)


def hang(text: str) -> tuple[int, int, float]:
    """``RANK:STEP:SECONDS``, e.g. ``1:30:5``."""
    parts = text.split(":")
    try:
        rank, step, seconds = int(parts[0]), int(parts[1]), float(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError("--hang takes RANK:STEP:SECONDS, e.g. 1:30:5, got "
                                         f"{text!r}") from None
    if rank < 0 or step < 0 or not seconds > 0:
        raise argparse.ArgumentTypeError("--hang needs a rank >= 0, a step >= 0 and seconds > 0, "
                                         f"got {text!r}")
    return rank, step, seconds


def hang_device(device: torch.device) -> Callable[[float], None]:
    """A way to keep ``device`` busy for some seconds without the host waiting: one spinning CUDA
    kernel."""
    if device.type != "cuda":
        raise SystemExit(
            f"--hang needs a CUDA GPU, but this rank runs on {device}: on the CPU every step runs "
            "to completion as it is issued, so the throttle never waits and there is no stall to "
            "report (tests/test_stall.py shows the report on a fake device)"
        )
    from asyncthrottle.bench.cuda_sleep import CudaSleepBench

    # calibrated once: a host-device sync before training
    return CudaSleepBench(str(device)).launch


def straggle(text: str) -> tuple[int, float]:
    """``RANK:FACTOR``, e.g. ``1:1.5``."""
    rank, _, factor = text.partition(":")
    try:
        parsed = int(rank), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--straggle takes RANK:FACTOR, e.g. 1:1.5, got {text!r}"
        ) from None
    if parsed[0] < 0 or not parsed[1] >= 1:
        raise argparse.ArgumentTypeError("--straggle needs a rank >= 0 and a factor >= 1, got "
                                         f"{text!r}")
    return parsed


def setup() -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes; one GPU per local rank, else the CPU with gloo."""
    if "RANK" not in os.environ:
        raise SystemExit("error: run this under torchrun, e.g. torchrun --nproc_per_node=2 "
                         "examples/ddp_mnist.py")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def reduce_stats(stats: at.Stats,
                 device: torch.device) -> tuple[dict[str, float], list[dict[str, float]]]:
    """One all-gather of every rank's numeric stats: (reduced over ranks, per rank)."""
    fields = SUMMED + MAXED
    row = stats.as_dict()
    mine = torch.tensor([float(row[name]) for name in fields], dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    # the only collective about the throttle, once, at the end
    dist.all_gather(rows, mine)
    per_rank = [dict(zip(fields, r.tolist(), strict=True)) for r in rows]  # host-device sync: once
    reduced = {name: sum(r[name] for r in per_rank) for name in SUMMED}
    reduced.update({name: max(r[name] for r in per_rank) for name in MAXED})
    return reduced, per_rank


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = setup()
    torch.manual_seed(args.seed)
    log = print if rank == 0 else (lambda *a, **k: None)
    max_steps = (
        args.max_steps if args.max_steps is not None or device.type != "cpu" else CPU_MAX_STEPS
    )
    if args.max_steps is None and device.type == "cpu":
        log(f"note: no GPU here, so each epoch stops after {CPU_MAX_STEPS} steps per rank "
            "(--max-steps to change)")
    choice = [load_data(args.data, args.data_dir, args.seed, log=log).source if rank == 0 else None]
    # rank 0 downloads (or falls back) first; the others follow its choice
    dist.broadcast_object_list(choice)
    data = load_data(str(choice[0]), args.data_dir, args.seed)
    pin = device.type == "cuda"
    workers = args.workers if args.workers is not None else (2 if pin else 0)
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] = DistributedSampler(
        data.train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler,
                        num_workers=workers, pin_memory=pin, drop_last=True)
    model = DistributedDataParallel(Net().to(device), device_ids=[device.index] if pin else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    every = args.ranks_every if args.ranks_every is not None else (20 if args.straggle else None)
    stall = args.stall if args.stall is not None else (args.hang[2] / 2 if args.hang else "auto")
    thr = at.Throttle(args.depth, device=device, ranks_every=every, stall=stall)
    slow = args.straggle is not None and args.straggle[0] == rank
    hang_at = args.hang[1] if args.hang is not None and args.hang[0] == rank else None
    # every rank checks it has a GPU
    busy = hang_device(device) if args.hang is not None else None
    last_loss: list[float] = []
    # host copies: no sync
    thr.on_complete(lambda step, values: last_loss.append(float(values["loss"])))
    log(f"world={world} backend={dist.get_backend()} device={device} data={data.source} "
        f"depth={args.depth}")
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        steps = len(loader) if max_steps is None else min(max_steps, len(loader))
        progress = (
            False if args.no_progress or rank != 0 else {"total": steps, "desc": f"epoch {epoch}"}
        )
        for i, (x, y) in enumerate(thr.wrap(itertools.islice(loader, steps), progress=progress)):
            x, y = x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)
            sync = (i + 1) % args.accumulate == 0
            with contextlib.nullcontext() if sync else model.no_sync():
                # this rank's own work: what rank scores compare
                with thr.section("forward"):
                    began = time.perf_counter()
                    loss = nn.functional.cross_entropy(model(x), y)
                    # the straggler: its own work takes FACTOR times as long
                    if slow:
                        time.sleep((args.straggle[1] - 1) * (time.perf_counter() - began))
                # DDP all-reduces gradients here (enqueued, covered by this step's event): a
                # barrier, so this
                # section holds the wait for the slowest rank -- collective=True leaves it out of
                # the scores
                with thr.section("backward", collective=sync):
                    loss.backward()
            if sync:
                with thr.section("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            thr.defer(loss.detach(), name="loss")
            # this rank's device hangs
            if busy is not None and hang_at == (epoch - 1) * steps + i:
                # enqueued: the host goes on until the throttle has to wait
                busy(args.hang[2])
        # the others wait for it at their next gradient all-reduce
        if rank == 0:
            correct, total = evaluate(model.module, DataLoader(data.test, batch_size=1000), device,
                                      args.depth)
            log(f"epoch {epoch}: {steps} steps per rank in {time.perf_counter() - start:.1f} s, "
                f"rank 0 train loss {last_loss[-steps]:.3f} -> {last_loss[-1]:.3f}, "
                f"test accuracy {correct}/{total} = {correct / total:.1%}")
    print(f"rank {rank}: {thr.stats.steps} steps, max {thr.stats.max_in_flight} in flight",
          flush=True)
    reduced, per_rank = reduce_stats(thr.stats, device)
    if rank == 0:
        print(summary_text(reduced, per_rank, args.depth))
    stats = thr.stats
    # every rank names the slowest: its own view, no collective
    if stats.rank_scores is not None:
        scores = ", ".join(f"{score:.2f}" for score in stats.rank_scores)
        print(f"rank {rank}: slowest rank {stats.slowest_rank} (scores by rank: {scores})",
              flush=True)
    dist.destroy_process_group()
    return 0


def summary_text(reduced: dict[str, float], per_rank: list[dict[str, float]],
                 depth: int | None) -> str:
    """The throttle statistics of all ranks, reduced (see the module docstring for how)."""
    wall = sum(r["wall_s"] for r in per_rank)
    lines = [
        f"asyncthrottle across {len(per_rank)} ranks (depth={depth}): {int(reduced['steps'])} "
        f"steps, {int(reduced['completed'])} seen complete, max {int(reduced['max_in_flight'])} in "
        "flight on any rank",
        f"  host waited {reduced['wait_s']:.3f} s in {int(reduced['waits'])} waits "
        f"({reduced['wait_s'] / wall if wall else 0.0:.0%} of summed wall time); "
        f"slowest rank {reduced['wall_s']:.2f} s",
    ]
    for i, r in enumerate(per_rank):
        lines.append(f"  rank {i}: {int(r['steps'])} steps, max {int(r['max_in_flight'])} in "
                     f"flight, waited {r['wait_s']:.3f} s, wall {r['wall_s']:.2f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
