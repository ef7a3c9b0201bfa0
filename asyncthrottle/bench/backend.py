"""What a benchmark backend provides: events, a full sync, and the seed's workloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..core.events import EventFactory

__all__ = ["BenchBackend"]


class BenchBackend(Protocol):
    """A device the benchmarks can run the seed's experiments on.

    Attributes:
        name: short label printed beside every figure, e.g. ``"cuda (NVIDIA H200)"``,
            ``"jax-cpu"``, ``"simulated"``.
        simulated: True when the device is a stand-in (results must say so).
    """

    name: str
    simulated: bool

    def events(self) -> EventFactory:
        """The event factory a Throttle on this device uses."""

    def synchronize(self) -> None:
        """Block until every piece of work launched so far has run."""

    def add_one(self) -> Callable[[], None]:
        """One step of the seed's first experiment: ``y = x + 1`` on the device."""

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        """One step of the seed's second experiment: an ``n x n`` matrix product."""

    def train_step(self) -> Callable[[], None]:
        """One step of a small training loop (forward, backward, update)."""

    def close(self) -> None:
        """Release the device's resources."""
