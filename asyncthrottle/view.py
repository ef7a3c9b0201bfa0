"""The one-line wrapper: an iterable view of a data source under a Throttle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .throttle import Throttle

__all__ = ["Throttled", "throttle"]

T = TypeVar("T")


class Throttled(Generic[T]):
    """An iterable view of ``source`` under ``throttle``'s depth rule.

    Each ``iter()`` starts a new pass over the source; ``len()`` is the
    source's. Attributes the view does not have (``stats``, ``drain``,
    ``in_flight``, ``defer``, ``latest``, ``summary``, ...) come from its
    throttle, also during the loop. ``progress`` adds a tqdm bar.
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
        loop = self.throttle._iterate(self.source)
        if self.progress is False or self.progress is None:
            return loop
        from .progress import make_bar, with_bar

        total = len(self.source) if hasattr(self.source, "__len__") else None  # type: ignore[arg-type]
        return with_bar(self.throttle, loop, make_bar(self.progress, total))

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the wrapped {type(self.source).__name__} has no len()") from None

    def __getattr__(self, name: str) -> Any:
        if name in ("throttle", "source", "progress"):  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.throttle, name)

    def __repr__(self) -> str:
        return f"throttle({type(self.source).__name__}, depth={self.throttle.depth})"


def throttle(iterable: Iterable[T], depth: int | None = 2, *, progress: Any = False, **options: Any) -> Throttled[T]:
    """Iterate ``iterable`` with at most ``depth`` minibatches unfinished on the device.

    Example:
        >>> import asyncthrottle as at
        >>> loader = [1, 2, 3]
        >>> view = at.throttle(loader, depth=2, device="cpu")
        >>> sum(view), view.stats.steps
        (6, 3)

    Args:
        iterable: the data source, e.g. a ``DataLoader``.
        depth: steps allowed in flight (an int >= 1, or None to only track).
        progress: False, True (a tqdm bar), a dict of tqdm options (may hold
            ``tqdm_class``), or a tqdm class. The postfix shows steps done on
            the device, in flight, host wait %, device idle % and the latest
            deferred values, refreshed at tqdm's cadence; it never blocks.
        **options: keyword options of :class:`~asyncthrottle.Throttle`.
    """
    from .throttle import Throttle

    return Throttle(depth, **options).wrap(iterable, progress=progress)
