"""A throttle's loop: what it is built from, and its life (passes, step loops, ownership, host
times, close).

:class:`~asyncthrottle.Throttle` is the façade users see; it holds one :class:`Lifecycle` and
forwards to it. The view's passes and the framework callbacks reach the same object by a named
call, :func:`of`, never through the throttle's private attributes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from functools import partial
from threading import get_ident
from typing import TYPE_CHECKING, Any, TypeVar

from . import _compile
from ._passes import Passes
from .backends import Backend, resolve_backend
from .core.errors import closed
from .core.hosttime import HostTimes
from .core.notify import tell
from .core.ownership import Closed, Ownership, ValueWait
from .core.rule import Core
from .core.waits import auto_wait, resolve_wait
from .parts import OPTIONS, PARTS, build
from .parts._build import Build
from .parts.prefetch import Prefetch
from .parts.sections import Sections
from .parts.timing import DeviceTiming, Sampling
from .values import Completions

if TYPE_CHECKING:
    from .view import Pass

P = TypeVar("P")

# each living throttle's lifecycle, by its id (a throttle need not be hashable: a subclass
# may define __eq__), with a weak reference that removes the entry as the throttle goes. Both
# are weak: the lifecycle holds the callbacks, which may hold the throttle (held by it alone)
_LOOPS: dict[int, tuple[weakref.ref[object], weakref.ref[Lifecycle]]] = {}


def _forget(key: int, _: object) -> None:
    """The throttle of id ``key`` is gone: so is its entry."""
    _LOOPS.pop(key, None)


def of(throttle: object) -> Lifecycle:
    """The lifecycle of ``throttle``: how the view's passes and the framework callbacks drive it."""
    life = _LOOPS[id(throttle)][1]()
    assert life is not None, "a living throttle holds its lifecycle"
    return life


class Lifecycle:
    """One throttle's loop: its core, parts and values, and the calls that change them.

    It checks the options, resolves the backend and builds the core and the parts; then every
    call that changes the throttle (a wrapped pass's start and end, ``begin_step()``,
    ``end_step()``, ``mark()``, ``drain()``, ``pause()``, ``close()``) runs here: it claims the
    throttle (:class:`~asyncthrottle.core.ownership.Ownership`), tells the host times where a pass
    begins and ends (time counts only inside passes) and asks the core. Nothing here holds the
    throttle: dropping the throttle runs its finalizer (:meth:`release`).

    Attributes:
        core, backend, values, host, clock: what the throttle is made of (the core's rule, the
            resolved device, the deferred values, the host times, the host clock).
        passes: the wrapped pass running now, a step loop's open step, an error kept for later.
        drain_at_end: a wrapped pass waits for every step at its end (``drain=``).
        gaps_fetch: the time from ``end_step()`` to the next ``begin_step()`` is taking the next
            batch (:meth:`fetch_between_steps`); else it is the loop's time between steps.
        closed: the throttle was closed.
    """

    def __init__(self, owner: object, given: Mapping[str, Any]) -> None:
        # each value by its declaration's check, then what goes together: on every backend, before
        # anything is built; from here on every value is the checked one (the parts' too)
        options = {option.name: option.checked(given[option.name]) for option in OPTIONS}
        for part in PARTS:
            part.check(options)
        timeout: float | None = options["timeout"]
        wait = options["wait"]
        # "auto": chosen once the device is known
        chosen = None if wait == "auto" else resolve_wait(wait)
        if timeout is not None and chosen is not None and not chosen.honours_timeout:
            raise ValueError(f"timeout={timeout!r} cannot interrupt wait={wait!r}; use "
                             "wait='auto', 'hybrid', 'poll' or 'spin'")
        self.drain_at_end: bool = options["drain"]
        # which steps are timed (sample_every='s rule, carried to the parts by Build)
        sampling = Sampling.of(options)
        self.backend = backend = resolve_backend(
            options["device"], options["events"], options["streams"],
            blocking=chosen is not None and chosen.blocking_events, timing=sampling.on)
        strategy = chosen or auto_wait(backend.computes_on_host, timeout)
        if not _compile.seen():
            _compile.see_torch()
        depth = options["depth"]
        self.clock = clock = options["clock"]
        self.core = core = Core(depth if isinstance(depth, int) else None, backend.events,
                                strategy, timeout, clock)
        self.ownership = Ownership()
        # (no part, value or callback holds the throttle: dropping it frees it, see release)
        self.values = Completions(core, ValueWait(core, self.ownership))
        self.host = HostTimes(clock, core)
        self.parts = parts = build(Build(core, backend, options, clock, self.host, sampling))
        # to=: the wrapped loops' movers, one per device
        self.movers: Prefetch = parts[Prefetch]
        self._timing = parts.get(DeviceTiming)
        self.passes = Passes()
        self.gaps_fetch = False
        self.sections: Sections = parts[Sections]
        self.sections.in_step = self.passes.step_open
        self.closed = False
        # close()'s release; a dropped throttle's, or at the interpreter's exit (before its
        # finalization, which a gloo group must not see)
        self.release = release = Release(core, self.values, backend, tuple(parts.values()))
        weakref.finalize(owner, _release_if_held, weakref.ref(release))
        _LOOPS[id(owner)] = (weakref.ref(owner, partial(_forget, id(owner))), weakref.ref(self))

    def part(self, kind: type[P]) -> P | None:
        """The part of class ``kind``, or None when the options leave it off."""
        return self.parts.get(kind)

    def fetch_between_steps(self) -> None:
        """A framework takes and moves each batch between its step hooks: from now on, the time
        from ``end_step()`` to the next ``begin_step()`` is fetching, as a wrapped loop's next()."""
        self.gaps_fetch = True

    def _claim(self, what: str) -> None:
        """Claim the throttle for a step loop's call ``what``: a kept error first, none inside a
        wrapped pass (the caller releases the claim)."""
        self.ownership.claim(what)
        try:
            if self.passes.kept is not None:
                self.passes.raise_kept()
            self.passes.refuse(what)
        except BaseException:
            self.ownership.release()
            raise

    # -- step loops ----------------------------------------------------------

    def begin_step(self, at: float | None = None) -> int:
        """``Throttle.begin_step()``; ``at``: the host time it began, if earlier than now (never
        before the last step's end)."""
        ownership, core, passes = self.ownership, self.core, self.passes
        # (_claim(), inlined: every step of a step loop)
        ownership.claim("begin_step()")
        try:
            if passes.kept is not None:
                passes.raise_kept()
            passes.refuse("begin_step()")
            if passes.in_step:
                raise RuntimeError("begin_step() was called twice without end_step(); step() is "
                                   "not reentrant")
            now, host = self.clock(), self.host
            if at is not None and at < now:
                now = at if host.started is None else max(at, host.step_end)
            if host.started is None:
                host.begin(now)
                # a compile set up since (where no compile traces)
                _compile.see_dynamo()
            elif core.steps:
                # (max(0.0, ...) without its call, and no bound method made: every step)
                seconds = now - host.step_end
                seconds = seconds if seconds > 0.0 else 0.0
                if self.gaps_fetch:
                    core.fetched(core.steps, host.step_end, seconds)
                else:
                    host.between(core.steps, host.step_end, seconds)
            if not ownership.held:
                # the loop keeps the throttle between its steps, until drain() or pause()
                ownership.hold()
            # counted: a retry after a timeout counts only the time since
            host.step_end = now
            try:
                # may raise (timeout, Ctrl-C): the step has not begun
                core.admit()
            except BaseException:
                # the wait is counted as such, not again as fetching
                host.step_end = self.clock()
                raise
        except BaseException:
            ownership.release()
            raise
        passes.in_step = True
        return core.steps

    def end_step(self, failed: bool, at: float | None = None) -> None:
        """``Throttle.end_step()``, ``failed`` checked; ``at``: the host time it ended (None:
        now)."""
        # (begin_step()'s claim: another thread's end_step() is refused; a call only then)
        if self.ownership.owner != get_ident():
            self.ownership.check("end_step()")
        if not self.passes.in_step:
            raise RuntimeError("end_step() was called without begin_step(); call begin_step() "
                               "first")
        self.passes.in_step = False
        try:
            # a failed body is body too, not fetching
            self.host.step_end = now = self.clock() if at is None else at
            if failed:
                self.core.drop()
            else:
                self.core.record(now)
        finally:
            self.ownership.release()

    def mark(self) -> None:
        """``Throttle.mark()``."""
        ownership = self.ownership
        self._claim("mark()")
        try:
            now = self.clock()
            self.host.begin(now)
            if not ownership.held:
                # the loop keeps the throttle between its steps, until drain() or pause()
                ownership.hold()
            self.core.record(now)
            self.core.admit()
        finally:
            ownership.release()

    def drain(self) -> None:
        """``Throttle.drain()``."""
        self.ownership.claim("drain()")
        try:
            if self.passes.kept is not None:
                self.passes.raise_kept()
            self.core.drain()
            self.flush_timing()
            if self.passes.running() is None and not self.passes.in_step:
                self.host.end(self.clock())
                self.ownership.let_go()
        finally:
            self.ownership.release()

    def pause(self, at: float | None) -> None:
        """``Throttle.pause()``, ``at`` checked."""
        self._claim("pause()")
        try:
            if self.passes.in_step:
                raise RuntimeError("pause() was called with a step open; call end_step() first "
                                   "(failed=True drops it)")
            host = self.host
            if host.started is not None:
                host.end(max(host.started, self.clock() if at is None else at))
            self.ownership.let_go()
        finally:
            self.ownership.release()

    # -- wrapped passes: time counts only inside them ------------------------

    def start_pass(self, new: Pass[Any]) -> None:
        """``new``, a wrapped pass, starts now: it claims the throttle until it ends."""
        now = self.clock()
        # a compile set up since the throttle was made (where no compile traces)
        _compile.see_dynamo()
        self.ownership.claim("a wrapped loop")
        try:
            self.passes.start(new)
        except BaseException:
            self.ownership.release()
            raise
        self.host.begin(now)

    def end_pass(self, finished: Pass[Any]) -> None:
        """``finished`` has ended: if it was the running pass, the pass's time ends and its claim
        goes."""
        if self.passes.ends(finished):
            try:
                self.host.end(self.clock())
                self.flush_timing()
            finally:
                self.ownership.release()
                # a step loop's pass before this one has ended with it
                self.ownership.let_go()

    def flush_timing(self) -> None:
        """Read the device timing of the steps seen complete (the loop's thread; queries only)."""
        if self._timing is not None and self._timing.enabled:
            self._timing.flush()

    # -- the end ---------------------------------------------------------------

    def close(self, drain: bool) -> None:
        """``Throttle.close()`` (``drain``) or a ``with`` block left by an exception (not
        ``drain``: the open step dropped, nothing waited for); idempotent."""
        if self.closed:
            return
        ownership, passes = self.ownership, self.passes
        ownership.claim("close()")
        try:
            if passes.in_step:
                if drain:
                    raise RuntimeError("close() was called with a step open; call end_step() "
                                       "first (failed=True drops it)")
                passes.in_step = False
                self.core.drop()
            try:
                passes.close()
                if drain:
                    if passes.kept is not None:
                        passes.raise_kept()
                    self.core.drain()
                    self.flush_timing()
                self.host.end(self.clock())
            finally:
                self.closed, self.ownership = True, Closed()
                ownership.let_go()
                self.release()
        finally:
            ownership.release()

    def refuse_closed(self, what: str) -> None:
        """``RuntimeError`` naming ``what`` once the throttle is closed."""
        if self.closed:
            raise RuntimeError(closed(what))


class Release:
    """Lets go of what a closed or dropped throttle holds, once: each part's resources
    (``Part.close``), the values' pinned ring, the backend's pooled events, then the core's hooks.

    Run by ``close()``; by the throttle's finalizer as its last reference goes, or at the
    interpreter's exit (before its finalization, which a gloo group must not see); or by its own
    ``__del__`` where the cyclic garbage collector frees the throttle. The core holds its parts'
    hooks and the parts hold the core; nothing inside holds the throttle, so dropping it runs this,
    which unties the rest: each object is then freed as its last reference goes. But what it holds
    also holds the user's callbacks, which may hold the throttle (``thr.close()`` in an
    ``on_complete`` callback), and what a finalizer holds lives until it runs: the finalizer holds
    this weakly. A throttle its callbacks hold is then the garbage of a reference cycle, this among
    it: the collector clears the finalizer's weak reference and calls ``__del__`` here. A part whose
    ``close`` raises hides the release from no other (the first error is raised after).
    """

    __slots__ = ("__weakref__", "_held")

    def __init__(self, core: Core, values: Completions, backend: Backend,
                 parts: tuple[Any, ...]) -> None:
        self._held: tuple[Core, Completions, Backend, tuple[Any, ...]] | None = (
            core, values, backend, parts)

    def __call__(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            core, values, backend, parts = held
            tell([*(part.close for part in parts), values.close, backend.release, core.release])

    def __del__(self) -> None:
        self()


def _release_if_held(release: weakref.ref[Release]) -> None:
    """The throttle's finalizer: its release, unless the collector frees it (``Release.__del__``
    runs it)."""
    held = release()
    if held is not None:
        held()
