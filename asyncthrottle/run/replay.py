"""``run --replay PATH``: a run's report made again from its record (``run --events``), without
the script: the recorded calls told to the same :class:`~asyncthrottle.run.steps.Steps`, at the
recorded times, on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..audit.syncsites import SyncSites
from ..framework import ThrottleHooks
from .grouping import starts
from .optimizers import Optimizers
from .record import ANSWERS, load
from .steps import SAMPLE_EVERY, Steps

__all__ = ["Replayed", "replay_steps"]

# --trace keeps the timeline of this many recent steps (as a run's)
_TRACE_STEPS = 10_000

Event = tuple[Any, ...]


class Replayed:
    """What a record makes again: its ``head`` and ``end`` lines, the ``steps`` and ``sites``
    its events were told to (finished: every step delivered)."""

    def __init__(self, head: dict[str, Any], end: dict[str, Any], steps: Steps,
                 sites: SyncSites) -> None:
        self.head, self.end, self.steps, self.sites = head, end, steps, sites


def replay_steps(text: str, *, trace: bool = False) -> Replayed:
    """Tell a record's events (its JSON lines: ``text``) to a new Steps and sync audit, each at
    its recorded time; the throttle is the CPU's (``trace``: it keeps a timeline).

    Raises:
        ValueError: ``text`` is no record (:func:`~asyncthrottle.run.record.load`).
    """
    head, events, end = load(text)
    clock = _Clock()
    options = {"trace": _TRACE_STEPS if trace else 0, "nonfinite": None,
               "sample_every": SAMPLE_EVERY}

    def make(device: Any) -> ThrottleHooks:
        hooks = ThrottleHooks(None, device="cpu", clock=clock, **options)
        # (the step begins once the recorded run's throttle was made)
        feed.answer("ready")
        return hooks

    sites = SyncSites([str(root) for root in head.get("roots", [])])
    steps = Steps(make, sites, clock=clock)
    feed = _Feed(events, steps, sites, clock)
    feed.run()
    if not feed.finished:
        # a record cut short (its limit): its steps end at its last event
        steps.finish()
    if steps.runner is not None:
        # the report's steps: the live ones grouped by the classifier's, as the run's were
        steps.runner.regroup(starts(events))
    steps.seen.update(end.get("seen") or {})
    return Replayed(head, end, steps, sites)


def read(path: str) -> str:
    """The record at ``path``, as text.

    Raises:
        OSError: it cannot be read.
    """
    return Path(path).read_text(encoding="utf-8")


class _Clock:
    """The replay's clock: the time of the event being told."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


class _RecordedError(Exception):
    """The runner's own error, as its record names it."""

    def __repr__(self) -> str:
        return str(self.args[0])


class _Feed:
    """Tells each event to ``steps`` as its hook did; the script's objects (optimizers, their
    parameters, the frames running their steps) are stand-ins of their keys."""

    def __init__(self, events: list[Event], steps: Steps, sites: SyncSites, clock: _Clock) -> None:
        self.events, self.steps, self.sites, self.clock = events, steps, sites, clock
        self.at = 0
        self.optimizers = _Optimizers(self.answer)
        steps.optimizers = self.optimizers
        self.made: dict[int, Any] = {}
        self.frames: dict[int, object] = {}
        self.params: dict[int, object] = {}
        self.kinds: dict[tuple[str, str], type] = {}
        self._torch: Any = None
        self.finished = False

    def run(self) -> None:
        tell: dict[str, Callable[..., None]] = {
            "opt": self.opt, "made": self.made_one, "freed": self.freed, "fetch": self.fetch,
            "fetched": self.fetched, "forward": self.forward, "backward": self.backward,
            "backward_end": self.backward_end, "step": self.step, "step_end": self.step_end,
            "eval": self.steps.leave, "stop": self.steps.stop, "load": self.steps.load,
            "framework": self.framework, "framework_end": _nothing, "read": self.read,
            "error": self.error, "finish": self.finish, "ended": _ignored}
        while self.at < len(self.events):
            kind, at, *fields = self.events[self.at]
            if kind not in ANSWERS:
                self.clock.now = at
                tell[kind](*fields)
            self.at += 1

    def answer(self, kind: str) -> Any:
        """The answer of ``kind`` recorded right after the event being told (consumed), or
        None where none was (the script's state had not changed)."""
        following = self.at + 1
        # (past the run's own live steps' ends: the replay's Steps ends its own)
        while following < len(self.events) and self.events[following][0] == "ended":
            following += 1
        if following < len(self.events) and self.events[following][0] == kind:
            self.at = following
            _, self.clock.now, *fields = self.events[following]
            return fields[0] if fields else True
        return None

    def opt(self, key: int, cls: list[str], params: list[int]) -> None:
        kind = self.kinds.get((cls[0], cls[1]))
        if kind is None:
            kind = self.kinds[cls[0], cls[1]] = type(cls[1], (_Optimizer,), {})
        stand_ins = [self.params.setdefault(param, _Parameter()) for param in params]
        self.made[key] = kind(stand_ins)

    def made_one(self, key: int) -> None:
        self.optimizers.made(self.made[key])

    def freed(self, key: int) -> None:
        # (the optimizers' weak set forgets it with its last reference)
        self.made.pop(key, None)

    def fetch(self) -> None:
        self.steps.fetch_begin()

    def fetched(self, start: float, seconds: float, stopped: bool, loader: Any) -> None:
        self.steps.fetch_end(start, seconds, stopped, loader)

    def forward(self, grad: bool, site: list[Any] | None) -> None:
        self.steps.forward(grad, None, None if site is None else tuple(site))

    def backward(self, loss: float | None) -> None:
        torch = self._torch
        if torch is None:
            import torch

            self._torch = torch
        # a loss of two values stands for none (not a scalar)
        tensor = torch.zeros(2) if loss is None else torch.tensor(loss, dtype=torch.float64)
        self.steps.backward(tensor)
        self.steps.backing = True

    def backward_end(self) -> None:
        self.steps.backing = False
        self.steps.after_backward()

    def step(self, key: int, frame: int) -> None:
        stand_in: Any = self.frames.setdefault(frame, _Frame())
        self.steps.optimizer_begin(self.made[key], stand_in)

    def step_end(self, frame: int) -> None:
        stand_in: Any = self.frames.pop(frame, _Frame())
        self.steps.optimizer_end(stand_in)

    def framework(self) -> None:
        # a framework's steps are its callback's throttle's, not in the record
        self.steps.stop()

    def read(self, call: str, path: str, line: int, via: list[Any] | None) -> None:
        self.sites.add((path, line, None if via is None else (via[0], via[1])), call)

    def finish(self) -> None:
        self.steps.finish()
        self.finished = True

    def error(self, text: str) -> None:
        self.steps.stop_on(_RecordedError(text))


class _Frame:
    """A stand-in of the frame that ran an optimizer step."""


class _Parameter:
    """A stand-in of an optimizer's parameter (its version: the record's answers)."""

    requires_grad = True
    _version = 0


class _Optimizer:
    """A stand-in of an optimizer the script made (its class: one of the recorded name)."""

    def __init__(self, params: list[Any]) -> None:
        self.param_groups = [{"params": params}]


class _Optimizers(Optimizers):
    """The optimizers, answering Steps' questions of the script's state from the record."""

    def __init__(self, answer: Callable[[str], Any]) -> None:
        super().__init__()
        self._answer = answer
        self._versions = 0

    def versions(self) -> int:
        found = self._answer("versions")
        if found is not None:
            self._versions = found
        return self._versions

    def running(self) -> bool:
        dropped = self._answer("dropped")
        if dropped:
            del self.frames[len(self.frames) - dropped:]
        return bool(self.frames)


def _nothing() -> None:
    pass


def _ignored(*fields: Any) -> None:
    """The run's live step ended: the replay's Steps ends its own (the report groups them by the
    recorded ones: see replay_steps)."""
