"""A tqdm progress bar whose postfix tells what the device is doing; never blocks or syncs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .parts import PARTS

if TYPE_CHECKING:
    from .throttle import Throttle


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
        raise TypeError("progress must be True, False, a dict of tqdm options or a tqdm class, got "
                        f"{progress!r}")
    if bar_class is None:
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:
            raise ModuleNotFoundError(f"progress=True needs tqdm: pip install tqdm ({exc})",
                                      name=exc.name or "tqdm") from exc
        bar_class = tqdm
    options.setdefault("total", total)
    return bar_class(**options)


def postfix(throttle: Throttle) -> str:
    """The bar's postfix: completed, in flight, host wait %, each part's figures (device idle %,
    ...: ``Part.postfix``), latest values.

    A value that is one number shows as ``name=value``. A list of numbers (a name deferred
    several times in the step, e.g. once per micro-batch under gradient accumulation) shows
    their mean, as ``name(mean)=value``. Anything else is not shown.
    """
    s = throttle.stats
    parts = [f"done={s.completed}", f"inflight={s.in_flight}", f"wait={s.wait_fraction:.0%}"]
    for part in PARTS:
        parts += part.postfix(s)
    for name, value in throttle.latest.items():
        if type(value) is list:
            number = _mean(value)
            name += "(mean)"
        else:
            number = _scalar(value)
        if number is not None:
            parts.append(f"{name}={number:.4g}")
    return " ".join(parts)


def _mean(values: list[Any]) -> float | None:
    """The mean of a list of numbers, or None when it is empty or an item is no number."""
    numbers = [_scalar(value) for value in values]
    if not numbers or None in numbers:
        return None
    return sum(n for n in numbers if n is not None) / len(numbers)


def _scalar(value: Any) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError, AttributeError):
        # not a scalar: not shown
        return None


class Bar:
    """Drives a tqdm bar from a pass: one update per hand-out, the postfix at tqdm's own cadence."""

    __slots__ = ("_bar", "_throttle", "_timer")

    def __init__(self, throttle: Throttle, bar: Any) -> None:
        self._throttle, self._bar = throttle, bar
        self._timer = getattr(bar, "_time", None)
        # its hook: on_handout, until close()
        throttle.subscribe(self)

    @classmethod
    def open(cls, throttle: Throttle, progress: Any, total: int | None) -> Bar | None:
        """The bar for ``progress=``, or None when the bar is disabled (then it costs nothing)."""
        bar = make_bar(progress, total)
        if getattr(bar, "disable", False) is True:
            bar.close()
            return None
        return cls(throttle, bar)

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        bar, timer = self._bar, self._timer
        last = getattr(bar, "last_print_t", None)
        if timer is None or last is None or timer() - last >= bar.mininterval:
            bar.set_postfix_str(postfix(self._throttle), refresh=False)
        bar.update(1)

    def close(self) -> None:
        self._throttle.unsubscribe(self)
        self._bar.set_postfix_str(postfix(self._throttle), refresh=False)
        self._bar.close()
