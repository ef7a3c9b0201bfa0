"""One throttle the runner reads (its own, or a framework's callback), and the loss series it
delivered: a few bytes a step, however long the run."""

from __future__ import annotations

import math
from array import array
from typing import Any

from ..framework import ThrottleHooks

__all__ = ["Source", "device_of"]


class _Series:
    """Floats by step: 9 bytes a step (the value, and whether one was delivered)."""

    def __init__(self) -> None:
        self._values = array("d")
        self._known = bytearray()

    def put(self, step: int, value: float | None) -> None:
        gap = step - len(self._values)
        if gap < 0:
            return
        if gap:
            self._values.extend([math.nan] * gap)
            self._known.extend(bytes(gap))
        self._values.append(math.nan if value is None else value)
        self._known.append(value is not None)

    def values(self, count: int) -> list[float | None]:
        """The first ``count`` steps' values, None where none was delivered."""
        known, values = self._known, self._values
        return [values[k] if k < len(known) and known[k] else None for k in range(count)]


class Source:
    """A throttle the runner reads and the losses it delivered (host copies, made floats as they
    arrive: no tensor is kept).

    ``names``: the optimizers whose own loss each step also defers (``"loss:<k>"``), two or more
    (a GAN); set by the runner as it learns them. ``direct``: the caller :meth:`put` s each
    step's losses itself (the runner's steps on a synchronous device), and nothing listens to the
    throttle's deliveries.
    """

    def __init__(self, hooks: ThrottleHooks, framework: str | None = None, *,
                 direct: bool = False) -> None:
        self.hooks = hooks
        self.framework = framework
        self.names: list[str] = []
        # the step the second optimizer first stepped in: the steps before had the first alone
        self._shared_from = 0
        self._loss = _Series()
        self._each: dict[str, _Series] = {}
        # each step's host time (its batch taken, or its first call, to its end) and its loader's
        # wait, as float32 seconds (8 bytes a step; NaN: not timed)
        self._step_s = array("f")
        self._wait_s = array("f")
        # between a step's hand-out and the throttle's next pause (see watch())
        self.in_pass = False
        # a byte a live step: 1 where it begins a report step (see regroup())
        self._starts = b""
        if not direct:
            hooks.throttle.on_complete(self._delivered)

    def watch(self, sites: Any) -> None:
        """Follow the throttle's steps from its notifications (a framework's callback runs them):
        whether it is in a pass, and the sync audit's ``in_step`` (a dropped step's reads are
        filed outside steps)."""
        self.hooks.throttle.subscribe(_Watch(self, sites))

    def named(self, name: str, step: int) -> None:
        """An optimizer first steps in ``step``: its name, the next of :attr:`names`."""
        self.names.append(name)
        if len(self.names) == 2:
            self._shared_from = step

    def _delivered(self, step: int, values: dict[str, Any]) -> None:
        # a host copy: reading it never syncs (and the sync audit does not count the runner's reads)
        self.put(step, values.get("loss"), {k: values.get(f"loss:{k}") for k in range(
            len(self.names))})

    def put(self, step: int, loss: Any, each: dict[int, Any]) -> None:
        """Keep ``step``'s loss and each optimizer's (by position), as floats: host values only
        (on a synchronous backend, the step's own tensors: reading them never syncs)."""
        self._loss.put(step, _float(loss))
        if len(self.names) > 1:
            self._put_each(step, {k: _float(value) for k, value in each.items()})

    def _put_each(self, step: int, each: dict[int, float | None]) -> None:
        for k, name in enumerate(self.names):
            self._each.setdefault(name, _Series()).put(step, each.get(k))

    def keep(self, step: int, seconds: float, waited: float, loss: float | None,
             each: dict[int, Any]) -> None:
        """A synchronous device's step: :meth:`times` and :meth:`put` in one call (every step),
        ``loss`` and ``each`` already floats (or None)."""
        if step == len(self._step_s):
            self._step_s.append(seconds)
            self._wait_s.append(waited)
        else:
            self.times(step, seconds, waited)
        self._loss.put(step, loss)
        if len(self.names) > 1:
            self._put_each(step, each)

    def times(self, step: int, seconds: float, waited: float) -> None:
        """Keep ``step``'s host time and its input wait (the runner's steps)."""
        gap = step - len(self._step_s)
        if gap:
            if gap < 0:
                return
            self._step_s.extend([math.nan] * gap)
            self._wait_s.extend([math.nan] * gap)
        self._step_s.append(seconds)
        self._wait_s.append(waited)

    def per_step(self) -> dict[str, list[float | None]] | None:
        """Each step's ``step_s`` and ``input_wait_s`` (None where not timed: a framework's steps
        have no wait each), or None where no step was timed."""
        if not self._step_s:
            return None
        count = self.live
        # float32 kept: 7 digits are what it holds
        return {name: [None if v is None else float(f"{v:.7g}") for v in self._merged(
                    [None if k >= len(kept) or math.isnan(kept[k]) else kept[k]
                     for k in range(count)], whole=True)]
                for name, kept in (("step_s", self._step_s), ("input_wait_s", self._wait_s))}

    def regroup(self, starts: bytes | bytearray) -> None:
        """The report's steps: live step ``k`` begins one where ``starts[k]`` is 1, else is part
        of the one before (:mod:`~asyncthrottle.run.grouping`); each live step past ``starts``
        is one. :attr:`steps`, :meth:`series`, :meth:`per_step` and :meth:`by_optimizer` are
        then the report steps'."""
        self._starts = bytes(starts)

    @property
    def live(self) -> int:
        """The live steps the throttle recorded."""
        return self.hooks.throttle.stats.steps

    @property
    def steps(self) -> int:
        """The report's steps: the live ones, grouped (:meth:`regroup`)."""
        return len(self._spans(self.live))

    def _spans(self, live: int) -> list[range]:
        """Each report step's live steps, of the first ``live``."""
        starts = self._starts[:live]
        spans: list[range] = []
        start = 0
        for k in range(1, len(starts) + 1):
            if k == len(starts) or starts[k]:
                spans.append(range(start, k))
                start = k
        return spans + [range(k, k + 1) for k in range(len(starts), live)]

    def _merged(self, values: list[float | None], *, whole: bool) -> list[float | None]:
        """``values`` by live step summed by report step: None where one is None (``whole``),
        else where all are."""
        out: list[float | None] = []
        for span in self._spans(len(values)):
            parts = [values[k] for k in span]
            known = [v for v in parts if v is not None]
            out.append(None if not known or (whole and len(known) < len(parts)) else sum(known))
        return out

    def series(self) -> list[float | None]:
        """Each step's loss (None where none was delivered); NaN and Inf stay floats."""
        return self._merged(self._loss.values(self.live), whole=True)

    def by_optimizer(self) -> dict[str, list[float | None]]:
        """With two or more optimizers, each one's loss series by its name (``"optimizer 0
        (Adam)"``): the ``backward()`` calls before its ``step()``; ``{}`` with one."""
        if len(self.names) < 2:
            return {}
        count = self.live
        each = {name: self._each.get(name, _Series()).values(count) for name in self.names}
        # before the second optimizer first stepped (a fine-tuning's new optimizer), the first
        # stepped alone: the step's loss was its own (kept before its series was)
        first = each[self.names[0]]
        for k, loss in enumerate(self._loss.values(min(self._shared_from, count))):
            if first[k] is None:
                first[k] = loss
        return {name: self._merged(values, whole=False) for name, values in each.items()}


class _Watch:
    """A subscriber of a framework throttle's hand-outs, records, drops and pauses."""

    def __init__(self, source: Source, sites: Any) -> None:
        self._source, self._sites = source, sites
        # the open step's hand-out (its host time runs to its record)
        self._began = math.nan

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self._source.in_pass = True
        self._began = now
        if self._sites is not None:
            self._sites.in_step = True

    def on_record(self, step: int, event: Any, now: float) -> None:
        # the framework's step, from its batch handed out to its end (its loader's wait for it is
        # the framework's, not told by step)
        self._source.times(step, now - self._began, math.nan)
        if self._sites is not None:
            self._sites.in_step = False

    def on_drop(self, step: int) -> None:
        if self._sites is not None and self._sites.in_step:
            self._sites.discard_step()
            self._sites.in_step = False

    def on_pause(self, now: float) -> None:
        self._source.in_pass = False


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def device_of(where: Any) -> Any:
    """The device of a module's parameters, an optimizer's, or a tensor's (or a list's first):
    None where none is found (the throttle then detects one)."""
    if isinstance(where, (list, tuple)):
        where = where[0] if where else None
    device = getattr(where, "device", None)
    if device is not None:
        return device
    groups = getattr(where, "param_groups", None)
    if groups:
        params = groups[0].get("params") or [None]
        return getattr(params[0], "device", None)
    parameters = getattr(where, "parameters", None)
    if callable(parameters):
        first = next(iter(parameters()), None)
        return getattr(first, "device", None)
    return None
