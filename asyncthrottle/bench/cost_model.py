"""The seed's cost model: launch (t1), device (t2) and sync (t3) costs, measured and used to
predict."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from .backends import BenchBackend

__all__ = ["CostModel", "measure_costs", "solve_device_s"]


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Per-step costs of one workload on one backend, in seconds.

    Attributes:
        t1: host time to launch one step's work (the seed's "front end issues the task").
        t2: device time to run one step's work (the seed's "back end computes").
        t3: one synchronisation on an idle device (the seed's "back end returns the result").
    """

    t1: float
    t2: float
    t3: float

    def predict(self, steps: int, depth: int | None) -> float:
        """Seconds for ``steps`` steps with at most ``depth`` in flight.

        ``depth=1`` is the seed's synchronous model, ``n * (t1 + t2 + t3)``.
        ``depth=None`` is the seed's asynchronous model, ``t1 + n * t2 + t3``,
        when the device is the bottleneck (``t2 >= t1``); when the host is,
        the roles swap (``n * t1 + t2 + t3``). In between, ``depth`` steps in
        flight must cover one round trip, so a step costs
        ``max(t1, t2, (t1 + t2 + t3) / depth)``.

        Example:
            >>> CostModel(t1=1.0, t2=3.0, t3=2.0).predict(10, 1)
            60.0
            >>> CostModel(t1=1.0, t2=3.0, t3=2.0).predict(10, None)
            33.0
        """
        if steps <= 0:
            return 0.0
        t1, t2, t3 = self.t1, self.t2, self.t3
        if depth == 1:
            return steps * (t1 + t2 + t3)
        per_step = max(t1, t2) if depth is None else max(t1, t2, (t1 + t2 + t3) / depth)
        return steps * per_step + min(t1, t2) + t3

    def as_dict(self) -> dict[str, float]:
        """The three costs in seconds."""
        return dataclasses.asdict(self)


def solve_device_s(launch_s: float, drain_s: float, k: int, t1: float, t3: float) -> float:
    """Device seconds per step, from one burst of ``k`` launches followed by a sync.

    The host spends ``launch_s`` launching (so ``t1 = launch_s / k``), then
    ``drain_s`` in the sync. Of the drain, ``t3`` is the sync itself; the rest,
    ``r``, is device work still queued when the host stopped launching. If the
    device kept up (``r <= t1``), only the last step was left: ``t2 = r``.
    Otherwise the device fell behind by ``t2 - t1`` per step after the first:
    ``r = t1 + k * (t2 - t1)``.

    Example:
        >>> round(solve_device_s(launch_s=10.0, drain_s=23.0, k=10, t1=1.0, t3=2.0), 9)
        3.0
    """
    if k < 1:
        raise ValueError(f"k must be an int >= 1 launches, got {k!r}")
    r = max(0.0, drain_s - t3)
    if r <= t1:
        return r
    return t1 + (r - t1) / k


def measure_costs(
    backend: BenchBackend,
    op: Callable[[], None],
    *,
    k: int = 50,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> CostModel:
    """Measure ``t1``, ``t2`` and ``t3`` for ``op`` on ``backend`` (medians of ``repeats``).

    ``t3``: ``backend.synchronize()`` on a drained device. ``t1`` and ``t2``:
    bursts of ``k`` launches followed by one sync (see :func:`solve_device_s`).
    Every measurement starts from a drained device; ``k`` is kept small so the
    burst never fills a bounded launch queue (CUDA's is ~1024 kernels).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    backend.synchronize()  # host-device sync: start from an idle device
    # syncs on an idle device
    t3 = statistics.median(_timed(backend.synchronize, clock) for _ in range(repeats))
    t1s, t2s = [], []
    for _ in range(repeats):
        backend.synchronize()  # host-device sync: each burst starts on an idle device
        start = clock()
        for _ in range(k):
            op()
        launched = clock()
        backend.synchronize()  # host-device sync: the drain this burst measures
        drained = clock()
        t1 = (launched - start) / k
        t1s.append(t1)
        t2s.append(solve_device_s(launched - start, drained - launched, k, t1, t3))
    return CostModel(t1=statistics.median(t1s), t2=statistics.median(t2s), t3=t3)


def _timed(fn: Callable[[], None], clock: Callable[[], float]) -> float:
    start = clock()
    fn()
    return clock() - start
