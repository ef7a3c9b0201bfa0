"""The Throttle: bounds how many minibatches are unfinished on the device."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, TypeVar

from . import _compile
from ._lifecycle import Lifecycle
from ._options import AutoDepth, check_at, check_bool
from ._passes import StepBlock
from .parts._declared import Keywords
from .parts.autodepth import DepthController
from .parts.sections import Section
from .parts.syncaudit import SyncAudit
from .parts.syncdetect import SyncDetect
from .parts.trace import Trace
from .stats import Stats, snapshot
from .values import Deferred, OnComplete
from .view import Throttled

T = TypeVar("T")


class Throttle(Keywords):
    """Blocks the host when more than ``depth`` minibatches are unfinished on the device.

    One event is recorded at the end of each step. Before the host starts step
    ``n``, every step ``<= n - depth`` has completed; no later step is ever
    waited for, except by ``drain()``. ``depth=1`` is "synchronise once per
    minibatch"; ``depth=2`` is what FSDP and MaxText use.

    Example:
        >>> thr = Throttle(depth=2, device="cpu")
        >>> for batch in thr.wrap(range(3)):
        ...     loss = thr.defer(batch * 2, name="loss")  # with tensors: a non-blocking copy
        >>> thr.stats.steps, thr.latest["loss"]
        (3, 4)

    Its keywords, their types, defaults and docs: ``Throttle.__init__`` (``help(Throttle)``), each
    declared once by what owns it (docs/architecture.md) and listed in the table of
    docs/depth-rule.md.

    Threads: one loop runs in one thread; ``stats``, ``latest``,
    ``in_flight`` and ``Deferred.ready()``/``get()`` are safe from any thread.
    Changing the throttle (a pass, a step, ``end_step()``, ``mark()``,
    ``drain()``, ``pause()``) from a second thread while the first uses it
    raises ``RuntimeError``; a ``step()``/``begin_step()``/``mark()`` loop
    uses it between its steps too, until ``drain()`` or ``pause()`` in its
    thread (or until that thread ends).

    Host-device syncs: the only ones are the waits the depth rule (and a
    ``max_memory`` budget) requires, ``drain()``, ``Deferred.get()`` on an
    unfinished step, and ``defer()`` of a device tensor on a synchronous
    throttle (nothing else would order the copy); everything else only
    records or queries events.
    """

    def _open(self, options: dict[str, Any]) -> None:
        # Keywords.__init__ (parts/_declared.py, written from the declarations) gives every
        # keyword by name
        self._life = Lifecycle(self, options)

    # -- reading: safe from any thread, never blocks ------------------------

    @property
    def depth(self) -> int | None:
        """Steps allowed in flight now (None: unbounded, tracking only); under ``depth="auto"``, its
        current choice."""
        return self._life.core.depth

    @property
    def synchronous(self) -> bool:
        """True when the backend runs work synchronously (the CPU): nothing is ever waited for."""
        return self._life.core.synchronous

    @property
    def latest(self) -> dict[str, Any]:
        """The most recent delivered value of each deferred name. Never blocks.

        A step's values are delivered in the throttle's own calls once it is seen complete (a
        hand-out, a wait, ``drain()``), not when this is read: after a ``break``, the last steps'
        values arrive at the next pass or ``drain()``, even if ``in_flight`` already reads 0.
        """
        # under torch.compile: run eagerly, as a graph break
        if _compile.compiling():
            return _compile.eagerly(getattr, self, "latest")  # type: ignore[no-any-return]
        return dict(self._life.values.latest)

    @property
    def in_flight(self) -> int:
        """Recorded steps whose events do not report completion. Queries, never blocks."""
        # under torch.compile: run eagerly, as a graph break
        if _compile.compiling():
            return _compile.eagerly(getattr, self, "in_flight")  # type: ignore[no-any-return]
        # a copy: safe to read from any thread
        pending = tuple(self._life.core.pending)
        return sum(1 for event in pending if not event.query())

    @property
    def stats(self) -> Stats:
        """A snapshot of the counters and telemetry; never blocks or syncs."""
        # under torch.compile: run eagerly, as a graph break
        if _compile.compiling():
            return _compile.eagerly(getattr, self, "stats")  # type: ignore[no-any-return]
        life = self._life
        return snapshot(life.core, life.host, life.parts.values(), life.backend)

    def summary(self) -> str:
        """A short human-readable report of :attr:`stats` (with ``detect_sync="warn"``, the sync
        sites among its parts' lines)."""
        return self.stats.summary()

    @property
    def sync_audit(self) -> SyncAudit | None:
        """With ``detect_sync="warn"`` on CUDA: the syncs counted per step and per site; else
        None."""
        detect = self._life.part(SyncDetect)
        return detect.audit if detect is not None else None

    def __repr__(self) -> str:
        life = self._life
        core, auto = life.core, "auto: " if life.part(DepthController) is not None else ""
        return (f"Throttle(depth={auto}{core.depth}, steps={core.steps}, "
                f"in_flight<={core.steps - core.completed}{', closed' if life.closed else ''})")

    # -- the throttle's life: closed once, by close(), its `with` block or its last reference ----

    def close(self) -> None:
        """Wait for every recorded step, then release what the throttle holds; idempotent.

        A wrapped loop still running ends as leaving it would (its step recorded; asked for more,
        it raises); called from an ``on_complete`` callback its ``next()`` delivers, it ends the
        loop there as a ``break`` would (no batch handed out after it); the steps recorded are
        drained (a host-device sync on the last one), so their
        values are delivered. Then the throttle lets go of its events, pinned buffers, process
        group and CUDA sync-debug mode. ``stats``, ``summary()``, ``latest`` and
        ``export_trace()`` stay readable; every call that would change it (a loop, a step,
        ``defer()``, ``section()``, ``drain()``, ...) raises ``RuntimeError`` naming itself.
        A throttle dropped without ``close()`` releases the same without waiting, as soon as its
        last reference goes (no garbage collection needed), or at the interpreter's exit; one its
        own callbacks refer to, when the garbage collector frees it.

        Raises:
            RuntimeError: a step is open (``begin_step()`` without ``end_step()``: call
                ``end_step()`` first; ``failed=True`` drops it), and nothing is closed; or
                another thread runs the loop. An error of the drain (a timeout, an
                ``on_complete`` callback's) is raised once the throttle is released.
        """
        self._life.close(drain=True)

    def __enter__(self) -> Throttle:
        """``with Throttle(...) as thr:`` -- closed when the block ends (see :meth:`close`)."""
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """A clean exit is :meth:`close`; an exception drops the open step and waits for nothing (as
        ``step()`` does): the steps in flight never deliver their values."""
        self._life.close(drain=exc_type is None)

    # -- the loop's entry points --------------------------------------------

    def wrap(self, iterable: Iterable[T], *, progress: Any = False, to: Any = None
             ) -> Throttled[T]:
        """An iterable view of ``iterable`` throttled by this object (see :func:`throttle`)."""
        self._life.refuse_closed("wrap()")
        return Throttled(self, iterable, progress=progress, to=to)

    def step(self) -> StepBlock:
        """A context manager for one step: enter waits for room, a clean exit records the event.

        An exception inside the block records nothing, blocks on nothing and
        drops the values deferred in it. Entering returns the step's number.
        """
        return StepBlock(self)

    def begin_step(self) -> int:
        """Start a step: wait until it may start (the depth rule) and return its number.

        With :meth:`end_step`, the same as entering and leaving ``step()``, for
        frameworks whose hooks cannot hold a ``with`` block (Lightning's
        ``on_train_batch_start``/``on_train_batch_end``). The time between
        ``end_step()`` and the next ``begin_step()`` is the loop's time between
        steps (``stats.between_s``), not fetching: the throttle cannot see what
        it is (a batch taken, an evaluation); ``drain()`` or ``pause()`` before
        an evaluation leaves it out of loop time.
        """
        return self._life.begin_step()

    def end_step(self, failed: bool = False) -> None:
        """End the step begun by :meth:`begin_step`: record its event (never blocks).

        Args:
            failed: the step's body raised: record nothing and drop its deferred values (True or
                False; anything else is a ``TypeError`` and the step stays open).
        """
        if failed is not False and failed is not True:
            check_bool("failed", failed)
        self._life.end_step(failed)

    def section(self, name: str, *, collective: bool = False) -> Section:
        """``with throttle.section(name):`` -- time a named phase of the current step on the device,
        without a sync.

        On an asynchronous device the sampled steps (``sample_every``) record
        a timing event as the section is entered and one as it is left, read
        once the step completes; on a synchronous backend the host clock
        times every step. ``stats.sections`` maps each name to its recent
        median device time in ms, and the summary shows a line per section.
        A name used several times in one step counts the sum. Under
        ``ranks_every``, rank scores compare the sections' sum -- the rank's
        own work -- instead of the step time (see docs/frameworks.md, DDP).

        Args:
            name: the phase, e.g. ``"forward"``.
            collective: the section holds a collective (DDP's backward and its
                all-reduce), so its time includes waiting for other ranks:
                rank scores leave it out of the rank's own work.

        Raises:
            TypeError: ``name`` is not a str, or ``collective`` not True or False.
            ValueError: ``name`` is empty.
            RuntimeError: entered outside a step (a wrapped loop's body,
                ``step()``, or between ``begin_step()`` and ``end_step()``),
                entered again while open, or still open when the step is
                recorded (raised by the record).
        """
        return self._life.sections.section(name, collective)

    def mark(self) -> None:
        """End the current step: record its event, then wait until the next step may start.

        For loops that cannot use ``step()``. Unlike the wrapper, the next batch
        is fetched after the wait, so data loading does not overlap it (under
        ``mark()`` fetching is part of the loop body: ``fetch_s`` stays 0).
        """
        self._life.mark()

    def drain(self) -> None:
        """Wait for every recorded step (a host-device sync for the last one).

        Outside a wrapped loop, ``drain()`` also ends the pass: the time until
        the next step (an evaluation between epochs) is not loop time.
        """
        self._life.drain()

    def pause(self, at: float | None = None) -> None:
        """End the pass of a ``step()``/``begin_step()``/``mark()`` loop now, without waiting.

        The time from ``at`` (the throttle's clock; default now) until the next
        step is not loop time -- for a framework that stops training without
        draining (an exception, a skipped epoch). :meth:`drain` does the same
        after waiting. Never blocks.

        Raises:
            TypeError: ``at`` is not a number.
            ValueError: ``at`` is later than the throttle's clock now (or NaN): a time of
                another clock, such as ``time.time()`` where the clock is ``time.perf_counter``.
            RuntimeError: inside a wrapped loop or with a step open (they end
                their own passes).
        """
        if at is not None:
            check_at(at, self._life.clock())
        self._life.pause(at)

    # -- deferred values -----------------------------------------------------

    def defer(self, value: Any, name: str | None = None, *, copy: bool = False) -> Deferred:
        """Snapshot ``value`` from the current step and send it to the host without a sync.

        ``value`` is a tensor, a numpy or JAX array, or a nested dict/list/tuple
        of them; the snapshot is taken now (later in-place updates do not
        change it). CUDA tensors are copied non-blocking into a ring of reused
        pinned buffers, ordered before the step's event, so the copy is
        complete when the step is (on a synchronous throttle a device tensor's
        copy blocks). A JAX array is held as it is (no device copy) and read
        once its step completes; an array donated to a jitted call before that
        is lost: ``get()`` and the delivery raise
        :class:`~asyncthrottle.values.DonatedValueError`.

        Args:
            value: the step's value, e.g. the loss.
            name: the key in :attr:`latest` and in ``on_complete`` callbacks
                (default ``"value"``, or ``"value_<k>"`` for the k-th unnamed
                one). A name deferred k > 1 times in one step maps to the list
                of its k values, in order.
            copy: copy JAX arrays on the device now (one dispatched copy,
                about 40 us on the CPU), so that a later step may donate
                them. Tensors and numpy arrays are always copied.
        """
        # under torch.compile: run eagerly, as a graph break
        if _compile.compiling():
            return _compile.eagerly(self.defer, value, name, copy=copy)  # type: ignore[no-any-return]
        return self._life.values.defer(value, name, copy)

    def on_complete(self, callback: OnComplete) -> OnComplete:
        """Call ``callback(step, values)`` for every step, in order, once it is seen complete.

        ``values`` maps names to the step's deferred values on the host. The
        callback runs on the loop's thread during the throttle's own
        bookkeeping (or ``drain()``): logging a loss every step adds no sync.
        Returns ``callback``, so it works as a decorator; remove it with
        :meth:`remove_on_complete`.
        """
        self._life.values.add(callback)
        return callback

    def remove_on_complete(self, callback: OnComplete) -> None:
        """Stop calling ``callback``; ``ValueError`` if it was not registered."""
        self._life.values.remove(callback)

    def export_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the timeline of the last ``trace`` steps to ``path`` as a Chrome trace (JSON).

        Open it in https://ui.perfetto.dev or ``chrome://tracing``, or draw it
        with ``python -m asyncthrottle plot``. Safe from any thread and during
        the loop (it writes what was recorded so far). See
        :class:`asyncthrottle.trace.Trace` for what the spans mean.

        Raises:
            RuntimeError: the throttle keeps no timeline (``trace=0``).
        """
        trace = self._life.part(Trace)
        if trace is None:
            raise RuntimeError(
                "export_trace() needs a timeline, but this Throttle was made with trace=0; "
                "pass e.g. Throttle(..., trace=10_000) to keep the last 10,000 steps"
            )
        trace.export(path, {"depth": self.depth, "stats": self.stats.as_dict()})

    def subscribe(self, part: object) -> None:
        """Notify ``part`` of the core's events (see :class:`asyncthrottle.core.Subscriber`)."""
        self._life.refuse_closed("subscribe()")
        self._life.core.subscribe(part)

    def unsubscribe(self, part: object) -> None:
        """Stop notifying ``part``."""
        self._life.core.unsubscribe(part)


def throttle(
    iterable: Iterable[T], depth: int | str | AutoDepth | None = 2, *, progress: Any = False,
    to: Any = None, **options: Any
) -> Throttled[T]:
    """Iterate ``iterable`` with at most ``depth`` minibatches unfinished on the device.

    Example:
        >>> import asyncthrottle as at
        >>> loader = [1, 2, 3]
        >>> view = at.throttle(loader, depth=2, device="cpu")
        >>> sum(view), view.stats.steps
        (6, 3)

    Args:
        iterable: the data source, e.g. a ``DataLoader``.
        depth: steps allowed in flight (an int >= 1, None to only track, ``"auto"`` or an
            :class:`~asyncthrottle.AutoDepth`).
        progress: False, True (a tqdm bar), a dict of tqdm options (may hold
            ``tqdm_class``), or a tqdm class. The postfix shows steps done on
            the device, in flight, host wait %, device idle % and the latest
            deferred values, refreshed at tqdm's cadence; it never blocks.
        to: the throttle's device (``"cuda"``, ``"cuda:1"``, a ``torch.device``): each batch's
            tensors are moved there as it is fetched, so the copy overlaps the step before (on
            CUDA through a copy stream and a ring of at most ``depth + 2`` reused pinned buffers;
            no syncs; docs/prefetch.md). Another device than the throttle's raises
            ``ValueError``, one that is not available ``RuntimeError``.
        **options: keyword options of :class:`~asyncthrottle.Throttle`.
    """
    return Throttle(depth, **options).wrap(iterable, progress=progress, to=to)
