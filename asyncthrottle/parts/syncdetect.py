"""Hidden-sync detection (``detect_sync=``): CUDA's sync debug mode, on from each hand-out until the
next wait."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import Option, check_choice
from ._build import Part
from .syncaudit import SyncAudit, summary_lines

if TYPE_CHECKING:
    from ..stats import Stats
    from ._build import Build

MODES = ("warn", "error", None)


def _flat_sites(sites: dict[str, float] | None) -> dict[str, Any]:
    return {f"syncs_per_step/{site}": rate for site, rate in (sites or {}).items()}


@dataclasses.dataclass(frozen=True)
class SyncStats:
    """The fields of :class:`~asyncthrottle.Stats` that hidden-sync detection supplies (with
    ``detect_sync="warn"`` on CUDA; None otherwise)."""

    sync_steps: int | None = None
    syncs: int | None = None
    syncs_per_step: float | None = None
    sync_sites: dict[str, float] | None = dataclasses.field(default=None,
                                                            metadata={"flat": _flat_sites})


class SyncDetect(Part):
    """Sets ``torch.cuda.set_sync_debug_mode(mode)`` for each step's window, restores it after.

    A window opens when a step is handed out (``on_handout``) and closes once
    the host has fetched the next batch (``on_fetch``), before the throttle
    waits for room: the loop body *and* whatever the framework runs between
    steps (logging, progress bars, collectives) are covered, the throttle's
    own waits never are. A wait inside the window (``drain()`` or
    ``Deferred.get()`` in a step) closes it for the wait and opens it again
    after. A pass that ends (``on_pause``) or a dropped step closes it.
    ``.item()``, ``print(tensor)`` or ``nonzero()`` in the window are then
    reported by PyTorch; with ``"warn"`` they are also counted per step and
    per site by :attr:`audit` (on the loop's thread only: the mode is
    process-global).
    """

    __slots__ = ("_active", "_cuda", "_mode", "_previous", "_resume", "audit")
    PLACE = 110
    OPTIONS = (
        Option("detect_sync", "str | None", None, "`\"warn\"`/`\"error\"`: report hidden syncs",
               "[Telemetry](telemetry.md#hidden-syncs)",
               functools.partial(check_choice, choices=MODES, fix="pass 'warn', 'error' or None"),
               wrong_type=(1,), wrong_value=("loud",),
               help=('``"warn"`` or ``"error"``: CUDA\'s sync debug mode from each hand-out until '
                     'the throttle next waits, so hidden syncs are reported (``"warn"`` also '
                     "counts them per site: :attr:`sync_audit`). Off CUDA it warns once, here, and"
                     " is off.")),
    )
    STATS = SyncStats

    @classmethod
    def build(cls, at: Build) -> SyncDetect | None:
        """The part, or None when off or without CUDA (said once, as a ``RuntimeWarning``)."""
        mode = at.options["detect_sync"]
        if mode is None:
            return None
        cuda = at.backend.sync_debug()
        if cuda is None:
            warn_at_user(f"detect_sync={mode!r} needs CUDA (torch.cuda.set_sync_debug_mode); the "
                         f"device here is {at.backend.describe()} without CUDA, so detect_sync is "
                         "off (hidden syncs are not detected)", RuntimeWarning)
            return None
        return cls(mode, cuda)

    def __init__(self, mode: str, cuda: Any) -> None:
        self._mode, self._cuda = mode, cuda
        self._previous: Any = 0
        self._active = self._resume = False
        self.audit = SyncAudit() if mode == "warn" else None

    def fields(self) -> dict[str, Any]:
        audit = self.audit
        if audit is None:
            return {}
        return {"sync_steps": audit.steps, "syncs": audit.syncs,
                "syncs_per_step": audit.syncs_per_step, "sync_sites": dict(audit.top())}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if stats.sync_steps is None:
            return []
        return summary_lines(stats.sync_steps, stats.syncs or 0, stats.syncs_per_step or 0.0,
                             list((stats.sync_sites or {}).items()))

    def on_handout(self, step: int, in_flight: int, now: float) -> None:
        self._open(new_step=True)

    def on_fetch(self, step: int, start: float, seconds: float) -> None:
        self._close()

    def on_wait_begin(self, step: int) -> None:
        self._resume = self._active
        self._close()

    def on_wait(self, step: int, start: float, seconds: float) -> None:
        if self._resume:
            self._resume = False
            self._open(new_step=False)

    def on_drop(self, step: int) -> None:
        self._close()

    def on_pause(self, now: float) -> None:
        self._resume = False
        self._close()

    def close(self) -> None:
        """Restore CUDA's sync debug mode if a step's window is open (the mode is the process's)."""
        self._close()

    def _open(self, *, new_step: bool) -> None:
        if self._active:
            return
        self._active = True
        self._previous = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode(self._mode)
        if self.audit is not None:
            self.audit.start(new_step=new_step)

    def _close(self) -> None:
        if not self._active:
            return
        self._active = False
        if self.audit is not None:
            self.audit.stop()
        self._cuda.set_sync_debug_mode(self._previous)
