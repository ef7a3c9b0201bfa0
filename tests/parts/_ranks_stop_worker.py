"""Child of test_ranks.py: 2 gloo ranks, ranks_every=10; rank 1 stops calling the throttle (or never does).

Usage: python _ranks_stop_worker.py OUTDIR PORT MODE, MODE ``early`` (rank 1's data ends after 5 steps) or
``never`` (rank 1 runs no throttle). Writes OUTDIR/rank<r>.json when a rank finishes its loop.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 4  # the process group's timeout: no rank may wait longer than this


def run(rank: int, outdir: str, port: str, mode: str, done: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("asyncthrottle").addHandler(Keep())
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    import asyncthrottle as at

    steps = 20 if rank == 0 else 5
    if rank == 0 or mode == "early":
        thr = at.Throttle(2, device="cpu", ranks_every=10)
        for _ in thr.wrap(range(steps)):
            pass
        result = {"rank": rank, "steps": thr.stats.steps, "rank_scores": thr.stats.rank_scores, "logs": records}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f, default=str)
    if rank == 1:
        done.wait(60)  # type: ignore[attr-defined]  # rank 1 stays in the job (evaluation, say): no collective
    else:
        done.set()  # type: ignore[attr-defined]
    os._exit(0)  # skip destroy_process_group: not what is tested


if __name__ == "__main__":
    outdir, port, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    mp.spawn(run, args=(outdir, port, mode, done), nprocs=2, join=True)
