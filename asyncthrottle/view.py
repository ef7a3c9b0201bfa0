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
    ``in_flight``, ...) come from its throttle, also during the loop.
    """

    def __init__(self, throttle: Throttle, source: Iterable[T]) -> None:
        if not isinstance(source, Iterable):
            raise TypeError(f"throttle() needs an iterable such as a DataLoader, got {type(source).__name__}")
        self.throttle = throttle
        self.source = source

    def __iter__(self) -> Iterator[T]:
        return self.throttle._iterate(self.source)

    def __len__(self) -> int:
        try:
            return len(self.source)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"the wrapped {type(self.source).__name__} has no len()") from None

    def __getattr__(self, name: str) -> Any:
        if name in ("throttle", "source"):  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.throttle, name)

    def __repr__(self) -> str:
        return f"throttle({type(self.source).__name__}, depth={self.throttle.depth})"


def throttle(iterable: Iterable[T], depth: int | None = 2, **options: Any) -> Throttled[T]:
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
        **options: keyword options of :class:`~asyncthrottle.Throttle`.
    """
    from .throttle import Throttle

    return Throttle(depth, **options).wrap(iterable)
