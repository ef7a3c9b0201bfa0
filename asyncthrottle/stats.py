"""A frozen snapshot of what a throttle has seen, its verdict and its report."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .parts import PARTS, PartStats

if TYPE_CHECKING:
    from .backends import Backend
    from .core.hosttime import HostTimes
    from .core.rule import Core
    from .parts._build import Part

# How the verdict reads the loop: thresholds on fractions of wall time (see `verdict`).
# the host waits on the device for at least this share of the loop
_WAITS = 0.10
# at least this share of steps start with nothing queued on the device
_STARVED = 0.5
# fetching (or the host's own work: the loop body and the time between steps) takes at least this
# share of the loop
_DOMINANT = 0.5
# at least this share of steps let the device run dry inside the loop body
_DRY = 0.1
# a timed device idle at most this share of the time is the bottleneck, whatever the host did
_BUSY = 0.05
# timed steps needed before the device's idle share is believed
_BUSY_SAMPLES = 4

_ADVICE = {
    "device-bound": "the device is the bottleneck, as it should be: throughput is the device's",
    "depth-bound": "the device's queue runs empty (at hand-outs, or during slow loop bodies), so "
    "it starves while the host prepares the next step: try a larger depth, or depth='auto'",
    "input-bound": "the host spends its time taking batches from the source: look at DataLoader "
    "num_workers, pin_memory, prefetch_factor and the dataset's transforms",
    # the backend's own words replace this (Backend.host_advice)
    "host-bound": "the host spends its time in the loop body (Python, kernel launches, or a sync "
    "such as .item() that detect_sync='warn' would name): try bigger batches, torch.compile or "
    "CUDA graphs, and defer() values",
    "balanced": "no single part dominates",
    "synchronous": "the backend runs each step to completion as it is issued (the CPU): nothing "
    "runs ahead, so there is nothing to throttle; the loop body is the computation itself",
    "unknown": "too few steps to tell what limits the loop (a verdict needs 2 or more)",
}
# host-bound, where the time between the steps of a step()/begin_step() loop outweighs the body
_BETWEEN = (
    "the host spends its time between steps, outside the throttle's sight (taking the next batch, "
    "an evaluation, logging, a checkpoint: a step()/begin_step() loop cannot tell them apart): "
    "call drain() or pause() before an evaluation or a save, so that it is not loop time, and "
    "take the batches through thr.wrap(...) to see their fetching apart"
)


def advice(verdict: str, *, between_s: float = 0.0, body_s: float = 0.0,
           host: str | None = None) -> str:
    """What to try for ``verdict``: a host-bound loop is told where its host time went (the body, or
    between the steps of a step loop) and, for the body, ``host``: the backend's own advice."""
    if verdict == "host-bound":
        if between_s > body_s:
            return _BETWEEN
        if host is not None:
            return host
    return _ADVICE[verdict]


def _unlogged(value: object) -> dict[str, Any]:
    return {}


def _flat_histogram(histogram: tuple[int, ...]) -> dict[str, Any]:
    return {f"in_flight_hist_{k}": count for k, count in enumerate(histogram)}


@dataclasses.dataclass(frozen=True)
class _LoopStats:
    """The fields of :class:`Stats` that the core and the host clock supply."""

    steps: int = 0
    completed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    waits: int = 0
    wait_s: float = 0.0
    wait_outside_s: float = 0.0
    wall_s: float = 0.0
    wait_fraction: float = 0.0
    fetch_s: float = 0.0
    between_s: float = 0.0
    body_s: float = 0.0
    steps_per_s: float = 0.0
    starved_fraction: float = 0.0
    in_flight_histogram: tuple[int, ...] = dataclasses.field(default=(),
                                                             metadata={"flat": _flat_histogram})
    verdict: str = "unknown"
    # the summary's words, not a figure: left out of as_dict()
    advice: str = dataclasses.field(default=_ADVICE["unknown"], metadata={"flat": _unlogged})
    depth: int | None = None
    dry_fraction: float = 0.0


@dataclasses.dataclass(frozen=True)
class Stats(PartStats, _LoopStats):
    """Counters and telemetry of a throttle at one moment. Taking it never blocks or syncs.

    Host times come from the throttle's clock. Device times come from timing
    events on every ``sample_every``-th step, read only once those steps are
    known complete; totals are extrapolated from the samples. A step's device
    time runs from the later of the previous step's end and the step's
    hand-out to the host, to the step's end: it includes any gap before the
    step's first kernel, so it is an upper bound on busy time. Device idle is
    seen only when the queue was empty at hand-out: the gap from the previous
    step's end to that hand-out, a lower bound on the true idle time.

    The fields of a part that is off keep their defaults (None, 0 or empty).

    Attributes:
        steps: steps recorded (each step's event recorded once).
        completed: steps seen complete on the device.
        in_flight: ``steps - completed`` when the snapshot was taken (no polling).
        max_in_flight: most steps in flight, counted right after each record.
        waits: times the host blocked on the device.
        wait_s: seconds the host spent blocked inside passes.
        wait_outside_s: seconds the host spent blocked outside passes (a
            ``drain()`` after a ``break`` or with ``drain=False``, a
            ``Deferred.get()`` between epochs); not part of ``wall_s``.
        wall_s: seconds inside passes (see below), up to now while one runs.
        wait_fraction: ``wait_s / wall_s``.
        fetch_s: host seconds a wrapped loop spent taking the next batch from
            its source (0 in ``step()``/``begin_step()``/``mark()`` loops: the
            throttle does not see their fetching).
        between_s: host seconds between the steps of a ``step()``/
            ``begin_step()`` loop, from one step's end to the next one's start:
            the loop's own host work there (taking a batch, an evaluation,
            logging), which the throttle cannot tell apart, so it is not called
            fetching (with ``mark()``: part of the body).
        body_s: host seconds in the loop body (the rest of ``wall_s``).
        steps_per_s: ``steps / wall_s``.
        starved_fraction: share of hand-outs at which nothing was queued on the device.
        in_flight_histogram: ``h[k]`` = hand-outs with ``k`` steps in flight (last bucket: k or
            more).
        verdict: what limits the loop; see :func:`verdict`.
        advice: what to try, as the summary's verdict line says it: for the
            backend (``jax.jit`` on JAX, ``torch.compile`` on torch), and
            for where a host-bound loop's time went (its body, or between the
            steps of a step loop). Not in :meth:`as_dict`.
        depth: the depth in force (under ``depth="auto"``, its current choice).
        dry_fraction: share of steps during whose loop body the device ran dry
            (the previous step, queued at the hand-out, was complete at the record).
        device_samples: steps timed on the device (``sample_every``).
        device_busy_s, device_idle_s: device seconds busy and idle (extrapolated).
        idle_fraction: ``device_idle_s / (device_busy_s + device_idle_s)``.
        device_ms_mean, device_ms_p50, device_ms_p90: device ms per step (recent samples).
        depth_changes: under ``depth="auto"``, ``(step, depth)`` for its start
            and each change (the depth applies from that step's hand-out).
        stalls: waits reported as stalls (see ``Throttle(stall=)``).
        rank_scores: with ``ranks_every=`` under ``torch.distributed``: per
            rank, the fastest rank's recent median step time over that
            rank's (1.0: the fastest; NaN: no samples yet), from the last
            gather read; None before one. With sections, the sum of each
            step's sections that are not ``collective`` replaces the step time.
        slowest_rank: the rank with the lowest score (None before a gather).
        stopped_ranks: with ``ranks_every=``, once the gathers stopped (a rank
            stopped calling the throttle, so a gather failed after
            ``ranks_timeout``): the ranks the store names as behind (empty
            when it cannot tell); None while they go on. ``rank_scores`` then
            keeps the last gather's scores.
        sections: with ``Throttle.section(name)``: each name's recent median
            device time in ms per step (None before a timed section completes).
        max_memory, memory_peak: the ``max_memory`` budget and the most bytes
            its probe reported at a hand-out (None without a budget).
        memory_waits: times the budget made the host wait.
        memory_over: hand-outs at which the probe was over the budget (only
            with nothing in flight: the loop holds more than the budget without
            any queued step).
        pinned_bytes: pinned host bytes held by ``to=``'s staging ring (at
            most ``depth + 2`` buffers of the largest batch; 0 without ``to=``
            or off CUDA).
        nonfinite: steps whose deferred values held a NaN or an Inf (see
            ``Throttle(nonfinite=)``; 0 with ``nonfinite=None``).
        nonfinite_first: the first such step (None before one).
        sync_steps, syncs, syncs_per_step: with ``detect_sync="warn"`` on CUDA, the steps
            audited, the syncs counted on the loop's thread and their rate (None otherwise;
            see ``Throttle.sync_audit``).
        sync_sites: the sites that sync most, with their syncs per step (``as_dict()``:
            ``syncs_per_step/<site>``).

    Host times count only inside passes, where wall = fetch + between + body +
    wait: from a wrapped loop's first ``next()`` to its end (or ``break``),
    and for ``step()``/``mark()`` loops from the first step to ``drain()`` or
    ``pause()``; time between passes (an evaluation between epochs) is not
    loop time.
    """

    def as_dict(self) -> dict[str, Any]:
        """A flat dict of numbers and strings for TensorBoard, W&B or any logger (None values
        dropped)."""
        flat: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            flatten = field.metadata.get("flat")
            if flatten is not None:
                flat.update(flatten(value))
            elif value is not None:
                flat[field.name] = value
        return flat

    def summary(self) -> str:
        """A short human-readable report: the loop, then each part's lines, then the verdict."""
        lines = [
            f"asyncthrottle: {self.steps} steps in {self.wall_s:.2f} s ({self.steps_per_s:.3g} "
            f"steps/s), {self.completed} seen complete, max {self.max_in_flight} in flight",
            f"  host: waited {self.wait_s:.3f} s ({self.wait_fraction:.0%}) in {self.waits} waits, "
            f"fetching {self.fetch_s:.3f} s ({_share(self.fetch_s, self.wall_s)}), "
            + (f"between steps {self.between_s:.3f} s ({_share(self.between_s, self.wall_s)}), "
               if self.between_s > 0 else "")
            + f"loop body {self.body_s:.3f} s ({_share(self.body_s, self.wall_s)})",
        ]
        if self.wait_outside_s > 0:
            lines.append(f"  outside the loop: waited {self.wait_outside_s:.3f} s (drain() or "
                         "get() between passes)")
        for part in PARTS:
            lines.extend(part.summary_lines(self))
        lines.append(f"  verdict: {self.verdict} -- {self.advice}")
        return "\n".join(lines)


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def busy_idle(device: dict[str, Any]) -> float | None:
    """The device's idle share for :func:`verdict`, from the device fields of :class:`Stats` (None:
    too few samples)."""
    if device.get("device_samples", 0) < _BUSY_SAMPLES:
        return None
    idle: float | None = device.get("idle_fraction")
    return idle


def verdict(
    steps: int,
    wait_fraction: float,
    fetch_fraction: float,
    body_fraction: float,
    starved_fraction: float,
    *,
    synchronous: bool = False,
    dry_fraction: float = 0.0,
    device_idle: float | None = None,
    between_fraction: float = 0.0,
) -> str:
    """What limits a loop, from host-side facts and, when timed, the device's idle share.

    * ``"device-bound"``: the host waits (>= 10 % of wall time) and the device
      had work queued at most hand-outs; or the host rarely waits, yet the
      device had work queued at most hand-outs, never ran dry inside the
      bodies and, timed, was idle <= 5 % of the time (``device_idle``): the
      host ran ahead until something else blocked it (at ``depth=None``, a
      full launch queue) while the device was busy;
    * ``"depth-bound"``: the host waits, but at least half the steps start
      with nothing queued -- each wait empties the queue -- or the device ran
      dry inside at least 10 % of the loop bodies (``dry_fraction``: a slow
      body every few steps outlasts the queue);
    * ``"input-bound"``: the host rarely waits and fetching (a wrapped loop's
      source) takes >= 50 %;
    * ``"host-bound"``: the host rarely waits and its own work takes >= 50 %:
      the loop body, and in a ``step()``/``begin_step()`` loop the time
      between steps (``between_fraction``), which is never called fetching;
    * ``"balanced"`` otherwise (``"unknown"`` before the first steps);
    * on a synchronous backend (the CPU), ``"synchronous"`` instead of
      ``"host-bound"``/``"balanced"``: no device advice applies there.
    """
    if steps < 2:
        return "unknown"
    if synchronous:
        return "input-bound" if fetch_fraction >= _DOMINANT else "synchronous"
    if wait_fraction >= _WAITS:
        return ("depth-bound" if starved_fraction >= _STARVED or dry_fraction >= _DRY
                else "device-bound")
    busy = device_idle is not None and device_idle <= _BUSY
    if busy and dry_fraction < _DRY and starved_fraction < _STARVED:
        # always busy: the host's time went into waits the throttle does not see
        return "device-bound"
    if fetch_fraction >= _DOMINANT:
        return "input-bound"
    if body_fraction + between_fraction >= _DOMINANT:
        return "host-bound"
    return "balanced"


def snapshot(core: Core, host: HostTimes, parts: Iterable[Part],
             backend: Backend | None = None) -> Stats:
    """The :class:`Stats` of a throttle now, from its core, its host times, its parts and its
    backend (the advice's words); never blocks."""
    # completed first: never ahead of steps
    completed, steps = core.completed, core.steps
    synchronous = core.synchronous
    wall = host.wall_s()
    outside = host.outside_wait_s
    # inside passes: wall = fetch + between + body + wait
    wait_s = min(max(0.0, core.wait_s - outside), wall)
    fetch = min(host.fetch_s, wall - wait_s)
    between = max(0.0, min(host.between_s, wall - wait_s - fetch))
    body = max(0.0, wall - fetch - between - wait_s)
    histogram = tuple(core.histogram)
    handouts = sum(histogram)
    shares = [x / wall if wall > 0 else 0.0 for x in (wait_s, fetch, body, between)]
    starved = histogram[0] / handouts if handouts else 0.0
    dry = core.dry / steps if steps else 0.0
    fields: dict[str, Any] = {}
    for part in parts:
        fields.update(part.fields())
    said = verdict(steps, shares[0], shares[1], shares[2], starved, synchronous=synchronous,
                   dry_fraction=dry, device_idle=busy_idle(fields), between_fraction=shares[3])
    return Stats(
        steps=steps,
        completed=completed,
        in_flight=max(0, steps - completed),
        max_in_flight=min(steps, 1) if synchronous else core.max_in_flight,
        waits=core.waits,
        wait_s=wait_s,
        wait_outside_s=outside,
        wall_s=wall,
        wait_fraction=shares[0],
        fetch_s=fetch,
        between_s=between,
        body_s=body,
        steps_per_s=steps / wall if wall > 0 else 0.0,
        starved_fraction=starved,
        in_flight_histogram=histogram,
        verdict=said,
        advice=advice(said, between_s=between, body_s=body,
                      host=backend.host_advice if backend is not None else None),
        depth=core.depth,
        dry_fraction=dry,
        **fields,
    )
