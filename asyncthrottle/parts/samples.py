"""Samples a second (``batch_size=``): the loop's throughput in samples, each batch's size read from
its first tensor's leading dimension or given."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._options import Option, check_int
from ._build import Part

if TYPE_CHECKING:
    from ..core.hosttime import HostTimes
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

_RULE = "'auto' (each batch's leading dimension), an int >= 1 (every step's batch) or None"
_FIX = "e.g. batch_size='auto', or batch_size=64 for a step() loop"


def check_batch_size(name: str, value: object) -> Any:
    """``batch_size=``: ``"auto"``, an int >= 1 or None (off); another str is a ``ValueError``."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"{name} must be {_RULE}, got {value!r}; {_FIX}")
        return value
    return check_int(name, value, minimum=1, rule=_RULE, fix=_FIX)


def leading(batch: Any) -> int | None:
    """The leading dimension of ``batch``'s first tensor (or array): the batch itself, else the
    first value of a mapping or the first item of a list or tuple, looked into in turn; None
    where none has a shape with a dimension."""
    while True:
        kind = type(batch)
        # (the usual batches first: a tuple or list, a dict, then anything with a shape)
        if kind is tuple or kind is list:
            if not batch:
                return None
            batch = batch[0]
            continue
        if kind is dict:
            batch = next(iter(batch.values()), None)
            continue
        shape = getattr(batch, "shape", None)
        if shape is not None:
            # (a tuple of ints: numpy's, torch.Size, JAX's; an empty one has no dimension)
            return shape[0] if shape else None  # type: ignore[no-any-return]
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None


@dataclasses.dataclass(frozen=True)
class SampleStats:
    """The fields of :class:`~asyncthrottle.Stats` that samples a second supplies (``batch_size=``;
    None when it is off, or before a batch had a tensor)."""

    samples: int | None = None
    samples_per_s: float | None = None


class SampleRate(Part):
    """Samples a second over the loop's steps: the samples of the steps, over the loop's wall time.

    ``batch_size="auto"`` reads each batch a wrapped loop hands out (``on_batch``): the leading
    dimension of its first tensor (:func:`leading`), a partial last batch included; a batch with
    no tensor counts none. An int is every step's batch size, in any loop, and costs nothing per
    step (the samples are the steps times it).

    Args:
        core: the throttle's core (its steps).
        host: the throttle's host times (the wall time inside passes).
        size: the batch size, or None to read each batch's.
    """

    __slots__ = ("core", "host", "samples", "size")
    PLACE = 130
    OPTIONS = (
        Option("batch_size", "int | str | None", None,
               "samples a second: `\"auto\"` reads each batch's leading dimension, an int is every "
               "step's batch size", "[Telemetry](telemetry.md)", check_batch_size,
               wrong_type=(2.5, [64]), wrong_value=(0, "all"),
               help=("samples a second (``stats.samples_per_s``, the summary, the progress bar): "
                     '``"auto"`` reads the leading dimension of the first tensor of each batch a '
                     "wrapped loop hands out (of a dict, a list or a tuple: its first tensor); an "
                     "int is every step's batch size (any loop; no cost per step). None: off.")),
    )
    STATS = SampleStats

    @classmethod
    def build(cls, at: Build) -> SampleRate | None:
        size = at.options["batch_size"]
        if size is None:
            return None
        return cls(at.core, at.host, None) if size == "auto" else _Given(at.core, at.host, size)

    def __init__(self, core: Core, host: HostTimes, size: int | None) -> None:
        self.core, self.host, self.size = core, host, size
        # the samples of the batches read so far (batch_size="auto")
        self.samples = 0

    def on_batch(self, step: int, batch: Any) -> None:
        size = leading(batch)
        if size is not None:
            self.samples += size

    def fields(self) -> dict[str, Any]:
        samples = self.samples if self.size is None else self.size * self.core.steps
        if not samples:
            return {}
        wall = self.host.wall_s()
        return {"samples": samples, "samples_per_s": samples / wall if wall > 0 else None}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if stats.samples is None:
            return []
        rate = "-" if stats.samples_per_s is None else f"{stats.samples_per_s:,.0f}"
        return [f"  samples: {stats.samples:,} ({rate} samples/s)"]

    @staticmethod
    def postfix(stats: Stats) -> list[str]:
        rate = stats.samples_per_s
        return [] if rate is None else [f"samples/s={rate:.4g}"]


class _Given(SampleRate):
    """``batch_size=N``: no batch to read, so no hook (subscribing finds none)."""

    __slots__ = ()
    on_batch = None  # type: ignore[assignment]
