"""Whether the runner's hooks hear the script: not inside a framework's ``fit``/``train`` (its
callback finds the steps there), not while a DataLoader fetches on the loop's thread, not after
the runner's own error. The base of :class:`~asyncthrottle.run.steps.Steps`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .source import Source

__all__ = ["Hearing"]


class Hearing:
    """The framework and loader calls of :class:`~asyncthrottle.run.steps.Steps`, which holds
    the state they keep (declared here)."""

    framework: int
    framework_source: Source | None
    loading: bool
    error: Exception | None
    hushed: bool
    sites: Any
    sources: list[Source]
    input_wait: float
    loader: dict[str, Any] | None
    arm: Callable[[], None]
    disarm: Callable[[], None]

    def stop(self, at: float | None = None) -> None:
        """Training stops: the open step ends (:meth:`Steps.stop`)."""
        raise NotImplementedError

    def load(self, on: bool) -> None:
        """A DataLoader fetches a batch on the loop's thread (``on``), or has fetched it (or
        failed to): its dataset's modules are no forwards of the script's, and its reads
        (num_workers=0) stay on the host on any device."""
        self.loading = on
        self._hush()
        if self.sites is not None:
            self.sites.loading = on

    def stop_on(self, error: Exception) -> None:
        """The runner's own error: the hooks stand aside from now on (the report says so)."""
        self.error = error
        self._hush()

    def _hush(self) -> None:
        self.hushed = bool(self.framework or self.loading or self.error is not None)

    def framework_begin(self, source: Source) -> None:
        self.stop()
        self.framework += 1
        self._hush()
        self.framework_source = source
        self.disarm()

    def framework_end(self, source: Source) -> None:
        self.framework -= 1
        self._hush()
        if source not in self.sources:
            self.sources.append(source)
        if not self.framework:
            self.framework_source = None
        self.arm()

    def framework_fetch(self, seconds: float, loader: dict[str, Any] | None) -> None:
        """A framework's loop took a batch: the loader's wait, between its steps."""
        source = self.framework_source
        if source is not None and source.in_pass and not source.hooks.step_open:
            self.input_wait += seconds
            self.loader = loader
