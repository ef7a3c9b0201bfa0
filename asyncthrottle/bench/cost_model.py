"""d2l's cost model of asynchronous computation: a step's launch, device and sync seconds,
measured, and the run time they predict in each mode."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backends import BenchBackend

__all__ = ["CostModel", "measure_costs", "solve_device_s"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Per-step costs of one workload on one backend, in seconds (d2l's ``t1``, ``t2``, ``t3``).

    Attributes:
        launch_s: host time to launch one step's work (d2l's "the front end issues the task").
        device_s: device time to run one step's work (d2l's "the back end computes").
        sync_s: one synchronisation on an idle device (d2l's "the back end returns the result").
    """

    launch_s: float
    device_s: float
    sync_s: float

    def predict(self, steps: int, depth: int | None) -> float:
        """Seconds for ``steps`` steps with at most ``depth`` in flight.

        ``depth=1`` is the synchronous model, ``n * (launch + device + sync)``.
        ``depth=None`` is the asynchronous model, ``launch + n * device + sync``,
        when the device is the bottleneck (``device >= launch``); when the host is,
        the roles swap (``n * launch + device + sync``). In between, ``depth`` steps
        in flight must cover one round trip, so a step costs
        ``max(launch, device, (launch + device + sync) / depth)``.

        Example:
            >>> CostModel(launch_s=1.0, device_s=3.0, sync_s=2.0).predict(10, 1)
            60.0
            >>> CostModel(launch_s=1.0, device_s=3.0, sync_s=2.0).predict(10, None)
            33.0
        """
        if steps <= 0:
            return 0.0
        launch, device, sync = self.launch_s, self.device_s, self.sync_s
        if depth == 1:
            return steps * (launch + device + sync)
        round_trip = launch + device + sync
        per_step = max(launch, device) if depth is None else max(launch, device, round_trip / depth)
        return steps * per_step + min(launch, device) + sync

    def as_dict(self) -> dict[str, float]:
        """The three costs in seconds."""
        return dataclasses.asdict(self)


def solve_device_s(burst_s: float, drain_s: float, k: int, launch_s: float,
                   sync_s: float) -> float:
    """Device seconds per step, from one burst of ``k`` launches followed by a sync.

    The host spends ``burst_s`` launching (so ``launch_s = burst_s / k``), then
    ``drain_s`` in the sync. Of the drain, ``sync_s`` is the sync itself; the rest,
    ``r``, is device work still queued when the host stopped launching. If the
    device kept up (``r <= launch_s``), only the last step was left: the device
    time is ``r``. Otherwise the device fell behind by ``device_s - launch_s`` per
    step after the first: ``r = launch_s + k * (device_s - launch_s)``.

    Example:
        >>> round(solve_device_s(burst_s=10.0, drain_s=23.0, k=10, launch_s=1.0, sync_s=2.0), 9)
        3.0
    """
    if k < 1:
        raise ValueError(f"k must be an int >= 1 launches, got {k!r}")
    r = max(0.0, drain_s - sync_s)
    if r <= launch_s:
        return r
    return launch_s + (r - launch_s) / k


def measure_costs(
    backend: BenchBackend,
    op: Callable[[], None],
    *,
    k: int = 50,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> CostModel:
    """Measure the launch, device and sync seconds of ``op`` on ``backend`` (medians of
    ``repeats``).

    ``sync_s``: ``backend.synchronize()`` on a drained device. ``launch_s`` and
    ``device_s``: bursts of ``k`` launches followed by one sync (see
    :func:`solve_device_s`). Every measurement starts from a drained device; ``k``
    is kept small so the burst never fills a bounded launch queue (CUDA's is ~1024
    kernels).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    backend.synchronize()  # host-device sync: start from an idle device
    # syncs on an idle device
    sync_s = statistics.median(_timed(backend.synchronize, clock) for _ in range(repeats))
    launches, devices = [], []
    for _ in range(repeats):
        backend.synchronize()  # host-device sync: each burst starts on an idle device
        start = clock()
        for _ in range(k):
            op()
        launched = clock()
        backend.synchronize()  # host-device sync: the drain this burst measures
        drained = clock()
        launch_s = (launched - start) / k
        launches.append(launch_s)
        devices.append(solve_device_s(launched - start, drained - launched, k, launch_s, sync_s))
    return CostModel(launch_s=statistics.median(launches), device_s=statistics.median(devices),
                     sync_s=sync_s)


def _timed(fn: Callable[[], None], clock: Callable[[], float]) -> float:
    start = clock()
    fn()
    return clock() - start
