"""The throttle's waits in other tools' timelines: torch.profiler ranges and NVTX ranges for Nsight
Systems."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import Option, check_bool
from ._build import Part

if TYPE_CHECKING:
    from ..core.events import Event
    from ..core.rule import Core
    from ._build import Build

# the host blocks on a step before handing out the next one
WAIT_RANGE = "asyncthrottle.wait"
# the host blocks in drain() (the end of a pass)
DRAIN_RANGE = "asyncthrottle.drain"
# NVTX only: a step's body, from hand-out to record
STEP_RANGE = "asyncthrottle.step"


class ProfilerRanges(Part):
    """While a ``torch.profiler`` session records, each wait is a ``record_function`` range.

    A part of every throttle. Its hooks run only when the host is about to
    block (never on a step that does not wait); with no profiler active they
    cost one C call (``torch._C._autograd._profiler_enabled``, the profiler's
    own "is anything recording" flag) per wait. torch is never imported here:
    while it is not loaded no profiler can be active, and a wait costs this
    part nothing: it listens to the waits once torch is loaded when the
    throttle is made or when a pass ends (a JAX loop pays for no ranges; a
    program that loads torch only after it made the throttle gets the ranges
    from the pass after the one running then). So its wait hooks are not
    ``on_wait_begin``/``on_wait`` (which subscribing would add) but listened to
    by name once torch is loaded.

    Args:
        core: the throttle's core (tells whether ``drain()`` is waiting).
    """

    __slots__ = ("_core", "_open", "_torch")
    PLACE = 80

    @classmethod
    def build(cls, at: Build) -> ProfilerRanges:
        return cls(at.core)

    def __init__(self, core: Core) -> None:
        self._core = core
        # the range entered for the wait in progress
        self._open: Any = None
        # torch, once loaded (then the waits are heard)
        self._torch: Any = None
        self.on_pause(0.0)

    def on_pause(self, now: float) -> None:
        """A pass ended: listen to the waits once torch is loaded (none can be profiled
        before)."""
        if self._torch is None:
            torch = sys.modules.get("torch")
            if torch is not None:
                self._torch = torch
                self._core.listen("on_wait_begin", self.enter_wait)
                self._core.listen("on_wait", self.leave_wait)

    def close(self) -> None:
        """Leave the range of a wait that was cut short (its ``on_wait`` never came)."""
        self.leave_wait(-1, 0.0, 0.0)

    def enter_wait(self, step: int) -> None:
        torch = self._torch
        if not _profiler_enabled(torch):
            return
        name = DRAIN_RANGE if self._core.draining else WAIT_RANGE
        scope = torch.autograd.profiler.record_function(name, f"step {step}")
        scope.__enter__()
        self._open = scope

    def leave_wait(self, step: int, start: float, seconds: float) -> None:
        scope, self._open = self._open, None
        # also after an interrupted wait: the core calls on_wait in a finally
        if scope is not None:
            scope.__exit__(None, None, None)


def _profiler_enabled(torch: Any) -> bool:
    try:
        return bool(torch._C._autograd._profiler_enabled())
    # a torch without the private flag: the public module-level one
    except AttributeError:
        return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


def nvtx_module() -> Any:
    """``torch.cuda.nvtx``, checked usable: NVTX ranges are for Nsight Systems on CUDA.

    Raises:
        ImportError: torch is missing.
        RuntimeError: CUDA is not available (``nvtx=True`` would mark nothing).
    """
    try:
        import torch
    except ImportError:
        raise ImportError(
            "nvtx=True needs torch with CUDA: pip install 'asyncthrottle' (torch)"
        ) from None
    if not torch.cuda.is_available():
        raise RuntimeError(
            "nvtx=True pushes NVTX ranges for Nsight Systems, which needs CUDA, but "
            "torch.cuda.is_available() is False here; pass nvtx=False (torch.profiler sees the "
            "waits without it)"
        )
    return torch.cuda.nvtx


class NvtxRanges(Part):
    """NVTX ranges for Nsight Systems: ``asyncthrottle.wait``/``asyncthrottle.drain`` per wait, one
    per step.

    A wait is a pushed range named exactly so (nested in whatever range the
    host is in, and summed by name in Nsight's statistics); a
    step is a start/end range ``asyncthrottle.step N`` from its hand-out to
    its record, or until it is dropped (a failed ``step()``).

    Args:
        core: the throttle's core.
        nvtx: the NVTX module (``torch.cuda.nvtx``; tests pass a fake).
    """

    __slots__ = ("_core", "_nvtx", "_step")
    PLACE = 90
    OPTIONS = (
        Option("nvtx", "bool", False, "NVTX ranges for Nsight Systems (CUDA)",
               "[Timelines](timelines.md)", check_bool, wrong_type=(1,),
               help=("NVTX ranges for each wait and step (Nsight Systems; CUDA only: elsewhere it "
                     "warns once, here, and is off). Under a ``torch.profiler`` session each wait "
                     "is a ``record_function`` range anyway.")),
    )

    @classmethod
    def build(cls, at: Build) -> NvtxRanges | None:
        """The part, or None when off or without CUDA (said once, as a ``RuntimeWarning``)."""
        if not at.options["nvtx"]:
            return None
        try:
            nvtx = nvtx_module()
        except (ImportError, RuntimeError):
            # a script written for a GPU runs on a laptop, as detect_sync= does
            warn_at_user(f"nvtx=True needs CUDA (NVTX ranges for Nsight Systems); the device here "
                         f"is {at.backend.describe()} without CUDA, so nvtx is off (torch.profiler "
                         "still sees the waits)", RuntimeWarning)
            return None
        return cls(at.core, nvtx)

    def __init__(self, core: Core, nvtx: Any) -> None:
        self._core, self._nvtx = core, nvtx
        # the open step range's handle
        self._step: Any = None

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        # the previous step raised: it recorded nothing
        if self._step is not None:
            self._nvtx.range_end(self._step)
        self._step = self._nvtx.range_start(f"{STEP_RANGE} {step}")

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        if self._step is not None:
            self._nvtx.range_end(self._step)
            self._step = None

    def on_drop(self, step: int) -> None:
        """The step ended without an event (``end_step(failed=True)``, a failed record): close its
        range."""
        self.on_record(step, None, 0.0)

    def close(self) -> None:
        """End the range of a step still open (its record never came)."""
        self.on_record(-1, None, 0.0)

    def on_wait_begin(self, step: int) -> None:
        self._nvtx.range_push(DRAIN_RANGE if self._core.draining else WAIT_RANGE)

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        self._nvtx.range_pop()
