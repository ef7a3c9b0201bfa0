"""JAX events: a tiny barrier program dispatched after each step's work."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.events import EventFactory

_HINT = "asyncthrottle's JAX backend needs jax: pip install 'asyncthrottle[jax]'"
# markers from barrier_on() by device set, taken by this thread's next record()
_pending = threading.local()
# [barrier_on() was called]: until then record() does not look for markers
_BARRIERS: list[bool] = []


def _jax() -> Any:
    try:
        # deferred: `import asyncthrottle` never imports jax
        import jax
    except ImportError as exc:
        raise ModuleNotFoundError(f"{_HINT} ({exc})", name=exc.name or "jax") from exc
    return jax


@functools.cache
def _programs() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """The barrier (``tick``) and the data-dependent marker (``touch``), jitted once."""
    jax = _jax()
    jnp = jax.numpy

    def nonzero_corner(x: Any) -> Any:
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        # one element: reads the array, costs nothing
        corner = x[tuple(slice(0, 1) for _ in x.shape)]
        return jnp.sum(corner != 0, dtype=jnp.int32)

    def touch(leaves: list[Any]) -> Any:
        return sum((nonzero_corner(x) for x in leaves), jnp.zeros((), jnp.int32))

    return jax.jit(lambda seed: seed + 1), jax.jit(touch)


def barrier_on(*arrays: Any) -> None:
    """Make the next JAX event recorded in this thread also wait for ``arrays``.

    The plain barrier is ordered after the work XLA queued on its device
    (``tests/test_jax.py`` proves it for single-device programs). It does not
    cover work on other devices, nor, on XLA's CPU client, a program sharded
    over several devices: those run outside the device's queue and the barrier
    can complete before them. Call this at the end of such a step with its
    outputs (any pytrees of ``jax.Array``); it dispatches, at once, a tiny
    program that reads one element of each array, so the step's event
    completes only when they are computed. Donating the arrays afterwards is
    safe. Never blocks. Called where no event is recorded after it (a warm-up
    or evaluation loop), it keeps one marker per set of devices, each reading
    the one before, so the markers never pile up.

    Example:
        >>> for batch in thr.wrap(loader):                  # doctest: +SKIP
        ...     state, loss = sharded_step(state, batch)
        ...     asyncthrottle.jax.barrier_on(state, loss)
    """
    jax = _jax()
    _, touch = _programs()
    groups: dict[frozenset[Any], list[Any]] = {}
    for leaf in jax.tree_util.tree_leaves(arrays):
        if isinstance(leaf, jax.Array):
            groups.setdefault(frozenset(leaf.sharding.device_set), []).append(leaf)
    markers: dict[frozenset[Any], Any] = getattr(_pending, "markers", {})
    # one program per set of devices
    for devices, leaves in groups.items():
        before = markers.get(devices)
        # covers the ones before it
        markers[devices] = touch(leaves if before is None else [*leaves, before])
    _pending.markers = markers
    if not _BARRIERS:
        _BARRIERS.append(True)


def _take_pending() -> list[Any]:
    markers: dict[frozenset[Any], Any] | None = getattr(_pending, "markers", None)
    if not markers:
        # no barrier_on() since the last record: the per-step path
        return []
    _pending.markers = {}
    return list(markers.values())


class JaxEvent:
    """The end of a JAX step: its deferred arrays, or a barrier program, plus :func:`barrier_on`'s
    markers.

    A step that deferred arrays still being computed when it ends waits on those (:meth:`cover`):
    they are its outputs, what MaxText's throttler waits on, and dispatch nothing more. Otherwise
    ``record()`` dispatches a barrier program queued after the step's work on the device (it never
    blocks, except when XLA's own pacing of 32 programs in flight holds the dispatch): 6 us of host
    time on the CPU, more when the device's threads are busy. ``query()`` is the markers'
    ``is_ready()``; ``synchronize()`` their ``block_until_ready()``. An event never recorded counts
    as complete, like a torch event.

    Every JAX event can be timed (``elapsed_time``): XLA gives Python no device timestamps.
    ``observed_at`` is the host clock when ``query()`` or ``synchronize()`` first saw the event
    complete: an upper bound on when the device reached it. ``elapsed_time`` is the difference of
    two such bounds, so it is the device time between the markers when the host was waiting on both
    (a device-bound throttled loop: each is seen within the wait strategy's overshoot). A step
    handed out with nothing in flight starts at a marker recorded with :meth:`record_idle`, dated
    when it was recorded; so at depth 1 or in a starved loop the figure runs from the hand-out to
    the end's observation, an upper bound like CUDA's. A host callback inside the barrier was
    measured and rejected: 37 times the dispatch cost (226 us against 6 us on the CPU) and still
    late by up to the GIL's switch interval.

    One class for timed and plain events: device timing's sampled steps alternate the two at the
    throttle's call sites, where CPython's specialised attribute reads miss on a second type
    (0.5 us a step of the values bench's host cost, ``benchmarks/values_host_cost.py``).
    """

    __slots__ = ("_clock", "_cover", "_markers", "_seed", "_tick", "_watch", "idle_at", "lower",
                 "observed_at")

    def __init__(self, seed: Any, tick: Callable[[Any], Any], clock: Callable[[], float]) -> None:
        self._seed, self._tick, self._clock = seed, tick, clock
        # (an empty tuple until set: no list made per event)
        self._markers: list[Any] | tuple[()] = ()
        self._cover: list[Any] | tuple[()] = ()
        # when record_idle() dated it (None: not so recorded)
        self.idle_at: float | None = None
        # clock() when first seen complete
        self.observed_at: float | None = None
        # a lower bound on when the device reached it (None: unknown); see watch()
        self.lower: float | None = None
        # earlier events of the step, dated while the host waits on this one (see watch())
        self._watch: list[JaxEvent] | tuple[()] = ()

    def cover(self, arrays: list[Any]) -> None:
        """The step's deferred arrays: the next ``record()`` waits on those still being computed.

        Arrays already computed (a constant, a value from an earlier step) say nothing of the
        step's work, nor do arrays the step donated, so they are left out; with none left, the
        barrier program is dispatched.
        """
        cover = []
        # one call an array (is_ready raises on a deleted one): the per-step path
        for array in arrays:
            try:
                if not array.is_ready():
                    cover.append(array)
            except RuntimeError:
                # donated: it says nothing of the step's work
                pass
        self._cover = cover

    def record(self) -> None:
        cover, self._cover = self._cover, ()
        markers: list[Any] = _take_pending() if _BARRIERS else []
        if cover:
            # (cover() made the list: it is this event's alone)
            markers = cover if not markers else [*markers, *cover]
        else:
            # queued after the step's work on this device
            markers.append(self._tick(self._seed))
        self._markers, self.observed_at = markers, None

    def mark(self) -> None:
        """Record a marker inside a step (a section's start or end): a barrier after the work queued
        so far, leaving :func:`barrier_on`'s markers and the deferred arrays to the step's own
        event, which alone must cover them. Never blocks."""
        self._cover, self._watch = (), ()
        self._markers, self.observed_at = [self._tick(self._seed)], None
        # it completes after its dispatch
        self.lower = self._clock()

    def watch(self, events: list[JaxEvent]) -> None:
        """Date ``events`` (the step before's event, then this step's markers, in the order they
        were recorded) as the host waits on this event.

        XLA gives no device timestamps: a marker is dated when the host first sees it complete
        (``observed_at``), and the device reached it between ``lower`` and then. A section's
        markers are never waited on themselves, so without this both would first be seen in one
        poll, when the step retires, and read about 0 ms apart. Each ``query()`` of this event asks
        them first, in order, up to the first unfinished one (whose ``lower`` becomes now), and
        ``synchronize()`` blocks on each in turn (dated as the device reaches it: ``lower`` is
        ``observed_at``). A marker first seen complete completed after the one before it, so that
        one's ``lower`` is its own too. While the host waits for the step (a device-bound loop),
        each is so dated within the wait's overshoot; :meth:`resolves` tells when not.
        """
        self._watch = events

    def resolves(self, start: JaxEvent) -> bool:
        """Whether ``start.elapsed_time(self)`` is the device time between them within 10%: the
        sum of the spans in which each completed unseen (``observed_at - lower``) is at most a
        tenth of it. Markers first seen complete together, after neither was watched, never are.
        """
        begun = start.idle_at if start.idle_at is not None else start.observed_at
        early = start.idle_at if start.idle_at is not None else start.lower
        if begun is None or early is None or self.observed_at is None or self.lower is None:
            return False
        unseen = (begun - early) + (self.observed_at - self.lower)
        return unseen <= 0.1 * (self.observed_at - begun)

    def _look(self, block: bool) -> None:
        """Date the watched events seen complete, in order; ``block``: wait for each in turn."""
        clock = self._clock
        # the device reached each watched event after the one before it
        floor: float | None = None
        for event in self._watch:
            if event.observed_at is None:
                if not event.query():
                    event.lower = clock()
                    if not block:
                        return
                    event.synchronize()  # host-device sync: the caller waits for this step anyway.
                elif floor is not None and (event.lower is None or event.lower < floor):
                    event.lower = floor
            if event.lower is not None and (floor is None or event.lower > floor):
                floor = event.lower

    def query(self) -> bool:
        markers = self._markers
        if markers:
            if self._watch:
                self._look(False)
            try:
                # one call a marker: the per-step path
                for marker in markers:
                    if not marker.is_ready():
                        return False
            except RuntimeError:
                # is_ready raises on a deferred array a later step donated: ask the barrier instead
                if not all(marker.is_ready() for marker in self._live(markers)):
                    return False
            # nothing left to wait for: seen complete now
            self._markers, self._watch, self.observed_at = (), (), self._clock()
        elif self.observed_at is None:
            self.observed_at = self._clock()
        return True

    def synchronize(self) -> None:
        markers = self._markers
        if markers:
            if self._watch:
                self._look(True)
            # (a loop, not _live's any(): the per-step path of a device-bound loop)
            for marker in markers:
                if marker.is_deleted():
                    markers = self._live(markers)
                    break
            for marker in markers:
                marker.block_until_ready()  # host-device sync: the caller asked to block.
            # nothing left to wait for: seen complete now, as the device reached it (a wait is
            # only asked of an event seen unfinished)
            self._markers, self._watch = (), ()
            self.observed_at = self.lower = self._clock()
        elif self.observed_at is None:
            self.observed_at = self._clock()

    def _live(self, markers: list[Any] | tuple[()]) -> list[Any] | tuple[()]:
        """The markers, with a barrier in place of deferred arrays a later step donated.

        A donated array can no longer be asked; the barrier, dispatched now, is queued after the
        donating step too, so the event waits longer than its step, never less.
        """
        if any(marker.is_deleted() for marker in markers):
            live = [marker for marker in markers if not marker.is_deleted()]
            live.append(self._tick(self._seed))
            self._markers = markers = live
        return markers

    def record_idle(self) -> None:
        """Record on a device known to be idle: its completion is taken as now.

        The throttle records such a marker when it hands out a step with
        nothing in flight. Observing it later (after the step's end, at depth 1
        or in a starved loop) would date the step's start after its work. With
        the device idle there is nothing to wait for: no program is dispatched,
        and :func:`barrier_on`'s markers stay for the step's own event.
        """
        self._markers, self._cover, self._watch, self.observed_at = (), (), (), None
        self.idle_at = self._clock()

    def elapsed_time(self, end: JaxEvent) -> float:
        """Milliseconds between the completions of ``self`` and ``end`` (observed, or a marker's
        idle record)."""
        # when each completed: its idle record, else when it was seen complete
        start = self.idle_at if self.idle_at is not None else self.observed_at
        stop = end.idle_at if end.idle_at is not None else end.observed_at
        if start is None or stop is None:
            raise RuntimeError(
                "elapsed_time() needs both events recorded and seen complete; call query() or "
                "synchronize() first"
            )
        return (stop - start) * 1000.0


# the name of the timed events before they were one class with the plain ones
TimedJaxEvent = JaxEvent


def parse_jax_device(jax: Any, device: Any) -> Any:
    """The ``jax.Device`` a JAX ``device=`` names: None or ``"jax"`` (the first), ``"jax:N"``, or
    a ``jax.Device``."""
    if device is None or device == "jax":
        return jax.devices()[0]
    if isinstance(device, jax.Device):
        return device
    if not isinstance(device, str) or not device.startswith("jax:"):
        raise TypeError(f"device must be None, 'jax', 'jax:N' or a jax.Device, got {device!r}")
    devices = jax.devices()
    index = device[4:]
    if not index.isdigit() or int(index) >= len(devices):
        raise ValueError(
            f"device={device!r} names no JAX device: 'jax:N' takes an index into jax.devices(), "
            f"which has {len(devices)} ({devices}); use 'jax:0' .. 'jax:{len(devices) - 1}' or "
            "'jax'"
        )
    return devices[int(index)]


def computes_on_host(device: Any = None) -> bool:
    """Whether the JAX device (as :func:`jax_events` takes it) runs its programs on the host's own
    cores: XLA's CPU backend."""
    return bool(parse_jax_device(_jax(), device).platform == "cpu")


def jax_events(
    device: Any = None, *, timing: bool = False, clock: Callable[[], float] = time.perf_counter
) -> EventFactory:
    """An event factory for a JAX device: each event is a barrier program on it.

    Args:
        device: None or ``"jax"`` (the first of ``jax.devices()``), ``"jax:N"``
            (the N-th), or a ``jax.Device``.
        timing: events with ``elapsed_time``: every JAX event has it (see
            :class:`JaxEvent` for what the figure means); accepted for the
            backends' common signature.
        clock: the host clock of ``observed_at``.

    Raises:
        ModuleNotFoundError: jax is not installed.
        ValueError: ``"jax:N"`` names no device.
    """
    jax = _jax()
    target = parse_jax_device(jax, device)
    # commits the barrier to target
    seed = jax.device_put(jax.numpy.zeros((), jax.numpy.int32), target)
    tick, _ = _programs()
    # compiles the barrier now, not in the first record(); runs async, nobody waits
    tick(seed)
    # (a partial: one call fewer per step than a lambda)
    return functools.partial(JaxEvent, seed, tick, clock)
