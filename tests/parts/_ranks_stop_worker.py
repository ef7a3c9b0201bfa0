"""Child of test_ranks.py: 2 gloo ranks; rank 1 stops calling the throttle (or never calls it).

Usage: python _ranks_stop_worker.py OUTDIR PORT MODE, MODE ``early`` (ranks_every=10, rank 1's data
ends after 5 steps, before the first gather), ``late`` (ranks_every=5, rank 1, twice as slow, ends
after 12 steps: two gathers read, then it stops) or ``never`` (rank 1 runs no throttle). The process
group keeps gloo's default timeout (30 minutes): ``ranks_timeout`` bounds every wait. Rank 0 goes on
with short passes (an epoch's other work between them) until the throttle says the gathers stopped.
Writes OUTDIR/rank<r>.json when a rank is done with its throttle.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 4  # ranks_timeout: no rank may wait longer than this
EVERY = {"early": 10, "late": 5, "never": 10}
STEPS = {"early": 5, "late": 12, "never": 0}  # rank 1's


def run(rank: int, outdir: str, port: str, mode: str, done: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("asyncthrottle").addHandler(Keep())
    dist.init_process_group("gloo", rank=rank, world_size=2)  # gloo's default timeout: 30 minutes
    import asyncthrottle as at
    from asyncthrottle.testing import FakeClock

    steps = 20 if rank == 0 else STEPS[mode]
    if steps:
        clock = FakeClock()
        thr = at.Throttle(2, device="cpu", clock=clock, ranks_every=EVERY[mode], ranks_timeout=TIMEOUT_S)
        for _ in thr.wrap(range(steps)):
            clock.advance(0.010 * (2 if rank == 1 else 1))
        first = {"steps": thr.stats.steps, "logs": list(records)}
        deadline = time.monotonic() + 6 * TIMEOUT_S
        while rank == 0 and getattr(thr.stats, "stopped_ranks", None) is None and time.monotonic() < deadline:
            time.sleep(0.02)  # the program's other work between passes (an evaluation)
            for _ in thr.wrap(range(1)):
                clock.advance(0.010)
        stats = thr.stats
        result = {"rank": rank, "first": first, "rank_scores": stats.rank_scores, "logs": records,
                  "slowest": stats.slowest_rank, "stopped": getattr(stats, "stopped_ranks", None),
                  "summary": thr.summary()}
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f, default=str)
    if rank == 1:
        done.wait(60)  # type: ignore[attr-defined]  # rank 1 stays in the job (evaluation, say): no collective
    else:
        done.set()  # type: ignore[attr-defined]
    os._exit(0)  # skip destroy_process_group: not what is tested


if __name__ == "__main__":
    outdir, port, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    # forked ranks: torch is imported already (this process is itself forked from the suite's
    # server that imported it), and no process group nor thread of torch's exists yet to copy
    ctx = mp.get_context("fork")
    done = ctx.Event()
    mp.start_processes(run, args=(outdir, port, mode, done), nprocs=2, join=True, start_method="fork")
