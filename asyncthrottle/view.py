"""The one-line wrapper: an iterable view of a data source under a Throttle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .passes import open_pass

if TYPE_CHECKING:
    from .throttle import Throttle

__all__ = ["Throttled"]

T = TypeVar("T")

# The throttle's public API, forwarded by name; everything else comes from the source.
_FORWARDED = (
    "begin_step", "defer", "depth", "drain", "end_step", "export_trace", "in_flight", "latest", "mark",
    "on_complete", "remove_on_complete", "stats", "step", "subscribe", "summary", "synchronous", "unsubscribe",
)


class Throttled(Generic[T]):
    """An iterable view of ``source`` under ``throttle``'s depth rule: a drop-in for the source.

    Each ``iter()`` starts a new pass over the source (see
    :class:`~asyncthrottle.passes.Pass`); ``len()`` is the source's. The
    throttle's public API (``stats``, ``defer``, ``drain``, ``latest``,
    ``summary``, ...) is forwarded explicitly; every other attribute comes
    from the source, so ``view.dataset``, ``view.sampler`` and
    ``view.batch_size`` work as on a ``DataLoader``. ``progress`` adds a tqdm bar.
    """

    def __init__(self, throttle: Throttle, source: Iterable[T], *, progress: Any = False) -> None:
        if not isinstance(source, Iterable):
            raise TypeError(f"throttle() needs an iterable such as a DataLoader, got {type(source).__name__}")
        if not (progress in (False, None, True) or isinstance(progress, dict) or callable(progress)):
            raise TypeError(f"progress must be True, False, a dict of tqdm options or a tqdm class, got {progress!r}")
        self.throttle = throttle
        self.source = source
        self.progress = progress

    def __iter__(self) -> Iterator[T]:
        bar = None
        if self.progress is not False and self.progress is not None:
            from .progress import Bar

            bar = Bar.open(self.throttle, self.progress, _length(self.source))
        return open_pass(self.throttle, self.source, bar)

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the wrapped {type(self.source).__name__} has no len()") from None

    def __bool__(self) -> bool:
        """The source's truth (an empty list is falsy); a source with no length (a generator) is truthy."""
        try:
            return bool(self.source)
        except TypeError:  # e.g. a DataLoader over an IterableDataset: no len(), still something to iterate
            return True

    def __getattr__(self, name: str) -> Any:
        if name in ("throttle", "source", "progress"):  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        try:
            return getattr(self.source, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} view has no attribute {name!r}: neither its Throttle's public API "
                f"({', '.join(_FORWARDED)}) nor the wrapped {type(self.source).__name__} has it"
            ) from None

    def __repr__(self) -> str:
        return f"throttle({type(self.source).__name__}, depth={self.throttle.depth})"


def _forward(name: str) -> property:
    def get(view: Throttled[Any]) -> Any:
        return getattr(view.throttle, name)

    get.__doc__ = f"The throttle's ``{name}``."
    return property(get)


for _name in _FORWARDED:
    setattr(Throttled, _name, _forward(_name))


def _length(source: object) -> int | None:
    """``len(source)``, or None when it has none (an ``IterableDataset``'s DataLoader raises TypeError)."""
    try:
        return len(source)  # type: ignore[arg-type]
    except TypeError:
        return None

