"""A tqdm progress bar whose postfix tells what the device is doing; never blocks or syncs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .throttle import Throttle

__all__ = ["make_bar", "postfix", "with_bar"]

T = TypeVar("T")


def make_bar(progress: Any, total: int | None) -> Any:
    """A tqdm bar from ``progress=``: True, a dict of tqdm options, or a tqdm class."""
    options: dict[str, Any] = {}
    if isinstance(progress, dict):
        options = dict(progress)
        bar_class = options.pop("tqdm_class", None)
    elif progress is True:
        bar_class = None
    elif callable(progress):
        bar_class = progress
    else:
        raise TypeError(f"progress must be True, False, a dict of tqdm options or a tqdm class, got {progress!r}")
    if bar_class is None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ImportError("progress=True needs tqdm: pip install tqdm (or 'asyncthrottle')") from None
        bar_class = tqdm
    options.setdefault("total", total)
    return bar_class(**options)


def postfix(throttle: Throttle) -> str:
    """The bar's postfix: completed, in flight, host wait %, device idle %, latest values."""
    s = throttle.stats
    parts = [f"done={s.completed}", f"inflight={s.in_flight}", f"wait={s.wait_fraction:.0%}"]
    if s.idle_fraction is not None:
        parts.append(f"idle={s.idle_fraction:.0%}")
    for name, value in throttle.latest.items():
        number = _scalar(value)
        if number is not None:
            parts.append(f"{name}={number:.4g}")
    return " ".join(parts)


def _scalar(value: Any) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None  # not a scalar: not shown


def with_bar(throttle: Throttle, loop: Iterator[T], bar: Any) -> Iterator[T]:
    """Drive ``bar`` from the throttled ``loop``; the postfix is refreshed at tqdm's own cadence."""
    timer = getattr(bar, "_time", None)
    try:
        for item in loop:
            last = getattr(bar, "last_print_t", None)
            if timer is None or last is None or timer() - last >= bar.mininterval:
                bar.set_postfix_str(postfix(throttle), refresh=False)
            bar.update(1)
            yield item
    finally:
        bar.set_postfix_str(postfix(throttle), refresh=False)
        bar.close()
