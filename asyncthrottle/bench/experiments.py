"""The three experiments of d2l's "Asynchronous Computation" chapter (10000 x ``y = x + 1``, 500
matrix products, 500 steps of a small training loop), each run synchronised every step, fully
asynchronous, and throttled."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core.waits import WaitStrategy
from ..throttle import Throttle
from .backends import BenchBackend
from .cost_model import CostModel, measure_costs
from .reference import Reference

__all__ = [
    "EXPERIMENTS", "REFERENCE", "Experiment", "ExperimentResult", "ModeResult", "modes",
    "run_experiment", "run_mode", "throttle_options",
]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One of the three workloads: ``steps`` calls of the step ``make(backend)`` returns."""

    key: str
    title: str
    steps: int
    make: Callable[[BenchBackend], Callable[[], None]]


EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("add", "y = x + 1", 10_000, lambda backend: backend.add_one()),
    Experiment("matmul", "1000x1000 matrix product", 500, lambda backend: backend.matmul(1000)),
    Experiment("train", "small training loop", 500, lambda backend: backend.train_step()),
)

SYNC = "sync"
ASYNC = "async"
# the 15-line loop: a ring of depth + 1 events re-recorded in turn (bench.reference)
REFERENCE = "reference"


def modes(depths: Sequence[int]) -> list[tuple[str, int | None]]:
    """The modes in table order: (label, depth the cost model uses); each throttled depth beside the
    reference."""
    return (
        [(SYNC, 1), (ASYNC, None)]
        + [(f"depth {d}", d) for d in depths]
        + [(f"{REFERENCE} {d}", d) for d in depths]
    )


def throttle_options(backend: BenchBackend) -> dict[str, Any]:
    """How the bench makes a Throttle on ``backend``: the options it asks for, else
    ``events=backend.events()``.

    A backend with ``throttle_options()`` (CUDA: ``device=``) gets the library's own events and
    default options, device timing included, as a user who writes ``device="cuda"`` does.
    """
    options = getattr(backend, "throttle_options", None)
    return dict(options()) if options is not None else {"events": backend.events()}


@dataclasses.dataclass(frozen=True)
class ModeResult:
    """One timed run of one mode.

    Attributes:
        mode: ``"sync"``, ``"async"`` or ``"depth N"``.
        depth: the depth the cost model uses (1 for sync, None for async).
        steps: steps run.
        wall_s: seconds from the first launch until every step had completed.
        wait_s: seconds the host spent blocked (throttle waits, explicit syncs).
        max_in_flight: the throttle's ``stats.max_in_flight`` (a tracking-only
            throttle for sync and async).
        predicted_s: the cost model's prediction for this mode.
        timeline: (seconds since start, steps enqueued and not seen complete)
            after each step's launch, when sampled.
    """

    mode: str
    depth: int | None
    steps: int
    wall_s: float
    wait_s: float
    max_in_flight: int
    predicted_s: float
    timeline: tuple[tuple[float, int], ...] | None = None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def model_error(self) -> float:
        """Measured over predicted, minus one (0.05: 5 % slower than the model)."""
        return self.wall_s / self.predicted_s - 1.0 if self.predicted_s > 0 else float("nan")


def run_mode(
    backend: BenchBackend,
    op: Callable[[], None],
    steps: int,
    mode: str,
    depth: int | None,
    model: CostModel,
    *,
    wait: str | WaitStrategy = "poll",
    clock: Callable[[], float] = time.perf_counter,
    sample: bool = False,
) -> ModeResult:
    """Run ``steps`` steps of ``op`` in one mode and time it until the device is done."""
    if mode.startswith(REFERENCE):
        assert depth is not None
        return _run_reference(backend, op, steps, mode, depth, model, clock=clock, sample=sample)
    throttled = mode not in (SYNC, ASYNC)
    thr = Throttle(depth if throttled else None, wait=wait, clock=clock,
                   **throttle_options(backend))
    timeline: list[tuple[float, int]] | None = [] if sample else None
    synced = 0.0
    backend.synchronize()  # host-device sync: every mode starts on an idle device
    start = clock()
    if mode == SYNC:
        for _ in range(steps):
            with thr.step():
                op()
            if timeline is not None:
                timeline.append((clock() - start, thr.stats.in_flight))
            before = clock()
            backend.synchronize()  # host-device sync: every step, the synchronous mode
            synced += clock() - before
        # retires the last event; the device is already idle
        thr.drain()
    else:
        # drains at the end: a host-device sync on the last step
        for _ in thr.wrap(range(steps)):
            op()
            if timeline is not None:
                timeline.append((clock() - start, thr.stats.in_flight + 1))
    wall = clock() - start
    stats = thr.stats
    return ModeResult(
        mode=mode,
        depth=depth,
        steps=steps,
        wall_s=wall,
        wait_s=stats.wait_s + synced,
        max_in_flight=stats.max_in_flight,
        predicted_s=model.predict(steps, depth),
        timeline=None if timeline is None else tuple(timeline),
    )


def _run_reference(backend: BenchBackend, op: Callable[[], None], steps: int, mode: str, depth: int,
                   model: CostModel, *, clock: Callable[[], float], sample: bool) -> ModeResult:
    """The reference loop at ``depth``, timed like :func:`run_mode` times the throttle."""
    loop = Reference(range(steps), backend.events(), depth, clock=clock)
    timeline: list[tuple[float, int]] | None = [] if sample else None
    backend.synchronize()  # host-device sync: every mode starts on an idle device
    start = clock()
    # waits for every step at the end
    for _ in loop:
        op()
        if timeline is not None:
            timeline.append((clock() - start, len(loop.pending) + 1))
    wall = clock() - start
    return ModeResult(mode=mode, depth=depth, steps=steps, wall_s=wall, wait_s=loop.wait_s,
                      max_in_flight=loop.max_in_flight, predicted_s=model.predict(steps, depth),
                      timeline=None if timeline is None else tuple(timeline))


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """All modes of one experiment, with the costs measured before them."""

    key: str
    title: str
    steps: int
    costs: CostModel
    results: tuple[ModeResult, ...]

    def by_mode(self, mode: str) -> ModeResult:
        for result in self.results:
            if result.mode == mode:
                return result
        raise KeyError(f"no mode {mode!r} in experiment {self.key!r}; have "
                       f"{[r.mode for r in self.results]}")


def run_experiment(
    backend: BenchBackend,
    experiment: Experiment,
    *,
    depths: Sequence[int] = (1, 2, 4),
    scale: float = 1.0,
    repeat: int = 1,
    sample: bool = False,
    **options: Any,
) -> ExperimentResult:
    """Measure the costs, then run every mode ``repeat`` times and keep each mode's fastest run."""
    steps = max(1, round(experiment.steps * scale))
    op = experiment.make(backend)
    # warm-up: allocations, kernel selection, thread wake-ups
    for _ in range(min(steps, 10)):
        op()
    costs = measure_costs(backend, op, k=max(1, min(50, steps)),
                          clock=options.get("clock", time.perf_counter))
    results = []
    for mode, depth in modes(depths):
        runs = [
            run_mode(backend, op, steps, mode, depth, costs, sample=sample, **options)
            for _ in range(repeat)
        ]
        results.append(min(runs, key=lambda run: run.wall_s))
    return ExperimentResult(experiment.key, experiment.title, steps, costs, tuple(results))
