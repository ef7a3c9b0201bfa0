"""A torchrun job's ranks, and their reports carried to rank 0 through the job's c10d store."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol

__all__ = ["RANKS_TIMEOUT_S", "Job", "Store", "ended", "gather", "job"]

# --ranks-timeout's default, seconds: how long rank 0 waits for the other ranks' reports once its
# own script ended (a rank that ends a minute after rank 0 is a hang, or an evaluation of its own)
RANKS_TIMEOUT_S = 60.0
# how often rank 0 looks for the reports still missing, seconds
_POLL_S = 0.05


class Store(Protocol):
    """What this module uses of a ``torch.distributed.Store`` (``TCPStore``, ``HashStore``)."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...


class Job:
    """This process's place in a torchrun job: its ``rank`` of ``world``, its ``host``, and the
    keys of this run (its attempt) in the job's store.

    Args:
        rank: this process's rank.
        world: the number of ranks.
        store: the job's store (torchrun's agent's, or a stand-in).
        run: the run's id and attempt (``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``):
            the keys of another attempt are never read.
        host: this machine's name.
        pid: this process's id.
    """

    def __init__(self, rank: int, world: int, store: Store, *, run: str = "",
                 host: str | None = None, pid: int | None = None) -> None:
        self.rank, self.world, self.store = rank, world, store
        self.host = host if host is not None else socket.gethostname()
        self.pid = pid if pid is not None else os.getpid()
        self._prefix = f"asyncthrottle/run/{run}/"

    def key(self, what: str, rank: int | None = None) -> str:
        return self._prefix + what + ("" if rank is None else f"/{rank}")

    def start(self) -> None:
        """Tell the job that this rank's run started (its host and pid name it if it never
        reports)."""
        self.store.set(self.key("started", self.rank),
                       json.dumps({"host": self.host, "pid": self.pid}))

    def post(self, report: Mapping[str, Any]) -> None:
        """This rank's report, for rank 0."""
        self.store.set(self.key("report", self.rank), json.dumps(report))


def job(environ: Mapping[str, str], *, timeout: float = 30.0) -> Job | None:
    """This process's :class:`Job` under torchrun (``python -m torch.distributed.run``,
    ``accelerate launch``), connected to the store torchrun's agent hosts at
    ``MASTER_ADDR:MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE``: it outlives the script's
    process group); None outside torchrun, or for one rank.

    Raises:
        RuntimeError, ValueError: the store cannot be reached, or the environment is not
            torchrun's (the message names it).
    """
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    store = TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=timeout))
    run = "/".join((environ.get("TORCHELASTIC_RUN_ID", ""),
                    environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    return Job(int(environ["RANK"]), world, store, run=run)


def gather(job: Job, timeout: float, *, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep,
           alive: Callable[[int], bool | None] | None = None,
           stop: Callable[[], bool] = lambda: False,
           ) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """Rank 0: every rank's report (its own posted too), waiting at most ``timeout`` seconds for
    the late ones (or until ``stop()``); and the ranks that never reported, each with how it
    ended where known (:func:`ended`)."""
    missing = set(range(job.world))
    reports: dict[int, dict[str, Any]] = {}

    def arrived() -> bool:
        for rank in sorted(missing):
            if job.store.check([job.key("report", rank)]):
                reports[rank] = json.loads(job.store.get(job.key("report", rank)))
                missing.discard(rank)
        return not missing

    _poll(arrived, timeout, clock, sleep, stop)
    return reports, {rank: ended(job, rank, timeout, alive) for rank in sorted(missing)}


def ended(job: Job, rank: int, timeout: float,
          alive: Callable[[int], bool | None] | None = None) -> str:
    """How ``rank``, which sent no report, ended: what the store and (on this machine) its process
    tell."""
    if not job.store.check([job.key("started", rank)]):
        return ("it never started asyncthrottle run (it failed before, or runs the script "
                "without run)")
    told = json.loads(job.store.get(job.key("started", rank)))
    where = f"on {told['host']} (pid {told['pid']})"
    running = (alive or _alive)(told["pid"]) if told["host"] == job.host else None
    if running is None:
        return f"it started {where} and sent no report within {timeout:g} s (--ranks-timeout)"
    if running:
        return (f"it started {where} and was still running {timeout:g} s after rank 0 ended "
                "(a hang, or a longer script: raise --ranks-timeout)")
    return f"it started {where} and its process ended without a report (killed, or died)"


def _alive(pid: int) -> bool | None:
    """Whether process ``pid`` of this machine runs (None: cannot tell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return None
    return True


def _poll(done: Callable[[], bool], timeout: float, clock: Callable[[], float],
          sleep: Callable[[float], None], stop: Callable[[], bool]) -> bool:
    """Call ``done()`` until it is true, ``timeout`` seconds passed or ``stop()``; whether it came
    true."""
    deadline = clock() + timeout
    while not done():
        left = deadline - clock()
        if left <= 0 or stop():
            return False
        sleep(min(_POLL_S, left))
    return True
