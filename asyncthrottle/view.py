"""The one-line wrapper: an iterable view of a data source under a Throttle, and its passes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _lifecycle
from .core.errors import closed
from .core.loop import StepIterator

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle
    from ._progress import Bar
    from .throttle import Throttle

T = TypeVar("T")
# no batch kept
_EMPTY: Any = object()
# the view's own attributes; every other one is the source's
_OWN = ("throttle", "source", "progress", "_to", "_copy")

# The throttle's public API, forwarded by name; everything else comes from the source.
_FORWARDED = (
    "begin_step", "defer", "depth", "drain", "end_step", "export_trace", "in_flight", "latest",
    "mark", "on_complete", "remove_on_complete", "section", "stats", "step", "subscribe", "summary",
    "synchronous", "unsubscribe",
)


class Throttled(Generic[T]):
    """An iterable view of ``source`` under ``throttle``'s depth rule: a drop-in for the source.

    Each ``iter()`` starts a new pass over the source (see
    :class:`Pass`); ``len()`` is the source's. The
    throttle's public API (``stats``, ``defer``, ``drain``, ``latest``,
    ``summary``, ...) is forwarded explicitly; every other attribute comes
    from the source, so ``view.dataset``, ``view.sampler`` and
    ``view.batch_size`` work as on a ``DataLoader``. Setting or deleting an
    attribute does so on the source too (timm's ``loader.mixup_enabled =
    False`` reaches the loader); the throttle's API is read-only here.
    ``progress`` adds a tqdm bar; ``to`` moves each batch to the device as it
    is fetched (docs/prefetch.md): a device that is not the throttle's, or not
    available, raises here.
    """

    def __init__(self, throttle: Throttle, source: Iterable[T], *, progress: Any = False,
                 to: Any = None) -> None:
        if not isinstance(source, Iterable):
            raise TypeError("throttle() needs an iterable such as a DataLoader, got "
                            f"{type(source).__name__}")
        if not (progress in (False, None, True) or isinstance(progress, dict)
                or callable(progress)):
            raise TypeError("progress must be True, False, a dict of tqdm options or a tqdm class, "
                            f"got {progress!r}")
        copy = _lifecycle.of(throttle).movers.mover(to)
        object.__setattr__(self, "throttle", throttle)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "progress", progress)
        # (not `to`: a source's own .to() stays reachable)
        object.__setattr__(self, "_to", to)
        # to= (or Throttle(to=)'s default): moves each batch as it is fetched
        object.__setattr__(self, "_copy", copy)

    def __iter__(self) -> Iterator[T]:
        bar = None
        if self.progress is not False and self.progress is not None:
            from ._progress import Bar

            bar = Bar.open(self.throttle, self.progress, _length(self.source))
        return Pass(self.throttle, self.source, bar, self._copy)

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the wrapped {type(self.source).__name__} has no len()") from None

    def __bool__(self) -> bool:
        """The source's truth (an empty list is falsy); a source with no length (a generator) is
        truthy."""
        try:
            return bool(self.source)
        except TypeError:
            # e.g. a DataLoader over an IterableDataset: no len(), still something to iterate
            return True

    def __getattr__(self, name: str) -> Any:
        # not set yet (e.g. during unpickling)
        if name in _OWN:
            raise AttributeError(name)
        try:
            return getattr(self.source, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} view has no attribute {name!r}: neither its Throttle's "
                f"public API ({', '.join(_FORWARDED)}) nor the wrapped "
                f"{type(self.source).__name__} has it"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN or (name.startswith("__") and name.endswith("__")):
            object.__setattr__(self, name, value)
        elif name in _FORWARDED:
            raise AttributeError(
                f"cannot set {name!r} on a throttled view: it is the Throttle's, read-only here; "
                f"use view.throttle.{name} where the Throttle allows it"
            )
        else:
            # the view holds no state of the source's
            setattr(self.source, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN or (name.startswith("__") and name.endswith("__")):
            object.__delattr__(self, name)
        elif name in _FORWARDED:
            raise AttributeError(f"cannot delete {name!r} from a throttled view: it is the "
                                 "Throttle's")
        else:
            delattr(self.source, name)

    def __repr__(self) -> str:
        to = "" if self._to is None else f", to={self._to!r}"
        return f"throttle({type(self.source).__name__}, depth={self.throttle.depth}{to})"


def _forward(name: str) -> property:
    def get(view: Throttled[Any]) -> Any:
        return getattr(view.throttle, name)

    get.__doc__ = f"The throttle's ``{name}``."
    return property(get)


for _name in _FORWARDED:
    setattr(Throttled, _name, _forward(_name))


def _length(source: object) -> int | None:
    """``len(source)``, or None when it has none (an ``IterableDataset``'s DataLoader raises
    TypeError)."""
    try:
        return len(source)  # type: ignore[arg-type]
    except TypeError:
        return None


class Pass(StepIterator[T]):
    """The iterator of one pass; made by ``iter()`` on a throttled view.

    Its ``next()`` is the core's (:class:`~asyncthrottle.core.loop.StepIterator`: the
    record, the fetch and the admit); the pass adds its start and its end. The batch is
    fetched before the wait, so loading overlaps the device. A
    wait that raises (``ThrottleTimeout``, ``KeyboardInterrupt``) keeps the
    fetched batch: the next ``next()`` waits again and hands it out.

    Leaving a pass in any way -- a ``break``, a ``return``, an exception from
    the loop body or from a generator around the pass, ``close()``, the
    garbage collector -- records the step being run, without blocking: its
    work was enqueued whatever happened, so its deferred values arrive with
    it. (Python does not tell an iterator why it was let go; ``step()`` and
    ``end_step(failed=True)`` are the way to drop a failed step.) On a
    synchronous backend that record delivers the step's values, and may raise
    (``nonfinite="raise"``, an ``on_complete`` callback): where the pass was
    let go by its finalizer (a ``break``, the GC), which cannot raise, the
    throttle's next call that changes it raises the error, once -- the next
    pass's first batch, ``begin_step()``/``step()``, ``mark()``, ``drain()``
    or ``pause()``.

    A pass ended while its own ``next()`` runs -- ``close()`` in an ``on_complete`` callback that
    ``next()`` delivers, to stop training from the logger -- ends there as a ``break`` would: that
    ``next()`` raises ``StopIteration`` (the batch it fetched is not handed out), and the step it
    recorded is recorded once.

    A pass ended because a new pass over the same throttle started in the
    same thread (a nested ``for``, ``zip(view, view)``, an iterator kept after
    a ``break``) raises ``RuntimeError`` if it is asked for another batch:
    one throttle serves one loop at a time, and a loop is never cut short
    silently.
    """

    __slots__ = ("__weakref__", "_bar", "_copy", "_life", "_source", "_state", "_thr")

    def __init__(self, throttle: Throttle, source: Iterable[T], bar: Bar | None = None,
                 copy: Callable[[Any], Any] | None = None) -> None:
        life: Lifecycle = _lifecycle.of(throttle)
        # (its source's iterator, made as the pass starts: to='s copies it fetches)
        super().__init__(life.core, None)
        # (the throttle is held only to keep it alive while its loop runs: `for x in
        # at.throttle(loader)` holds the pass alone)
        self._thr, self._life, self._source, self._bar = throttle, life, source, bar
        # new -> running -> done
        self._state = "new"
        # to=: moves each batch to the device as it is fetched
        self._copy = copy

    def __iter__(self) -> Pass[T]:
        return self

    def _begin(self) -> T:
        """A ``next()`` with no step open: the pass's first (it starts, or says why it cannot), or
        the one after a ``next()`` that raised (the wait again for its batch, if it was fetched,
        else a new one)."""
        if self._items is None:
            self._start()
            return self.__next__()
        return super()._begin()

    def _failed(self, exc: BaseException) -> None:
        """``next()`` raised ``exc``: no batch is handed out (``StopIteration``: the pass ends)."""
        self.in_body = False
        if self._state != "running":
            # ended while its next() ran (a callback closed the throttle): no batch is kept
            self._held.clear()
        elif isinstance(exc, StopIteration):
            self._finish()

    def close(self) -> None:
        """End the pass now: the step in progress is recorded (never blocking)."""
        self._leave()

    def __del__(self) -> None:
        if self._state == "running":
            passes = self._life.passes
            try:
                self._leave()
            except Exception as exc:
                # a finalizer cannot raise (Python would only print it): the throttle's next call
                # raises it; its traceback keeps this frame, which must not keep the pass
                del self
                passes.keep(exc)

    def supersede(self, by: str) -> None:
        """End this pass, ``by`` a new pass over the throttle in this thread (``"superseded"``: its
        step's error is raised to the new pass) or by the throttle's ``close()`` (``"closed"``);
        asking it for more is an error."""
        try:
            self._leave()
        finally:
            self._state = by

    def _start(self) -> None:
        if self._state == "done":
            raise StopIteration
        if self._state == "closed":
            raise RuntimeError(closed("the next batch of a wrapped loop"))
        if self._state == "superseded":
            raise RuntimeError(
                "this loop over a throttled view was ended by a new loop over the same Throttle (a "
                "nested `for` over the view, zip(view, view), or a second iter()); one Throttle "
                "serves one loop at a time: give the inner loop its own Throttle, or iterate the "
                "source itself"
            )
        self._life.start_pass(self)
        self._state = "running"
        items = iter(self._source)
        # (set while the pass runs: a next() without it starts the pass, or says why not)
        self._items = items if self._copy is None else _Copies(items, self._copy)

    def _finish(self) -> None:
        """The source is exhausted: drain (unless told not to) and end the pass."""
        if self._life.drain_at_end:
            # may raise a timeout: the pass stays open, the next next() drains again
            self._core.drain()
            if self._state != "running":
                # a callback of the drain closed the throttle, which ended the pass
                return
        self._state = "done"
        self._items = None
        self._end()

    def _end(self) -> None:
        try:
            self._life.end_pass(self)
        finally:
            if self._bar is not None:
                self._bar.close()

    def _leave(self) -> None:
        if self._state != "running":
            return
        self._state = "done"
        self._items = None
        try:
            if self.in_body:
                self.in_body = False
                # the step's work is enqueued; recording never blocks
                self._core.record(self._life.clock())
        finally:
            self._end()


class _Copies(Iterator[Any]):
    """A source's batches copied to the device (``to=``) as each is fetched: issued before the
    wait, so the copy overlaps the step before. A batch whose copy raised (Ctrl-C, a device error)
    is copied again by the next ``next()``."""

    __slots__ = ("_copy", "_items", "_uncopied")

    def __init__(self, items: Iterator[Any], copy: Callable[[Any], Any]) -> None:
        self._items, self._copy = items, copy
        self._uncopied: Any = _EMPTY

    def __next__(self) -> Any:
        batch = self._uncopied
        if batch is _EMPTY:
            batch = next(self._items)
        else:
            self._uncopied = _EMPTY
        try:
            return self._copy(batch)
        except BaseException:
            self._uncopied = batch
            raise
