"""Hidden-sync detection: CUDA's sync debug mode, on from each hand-out until the throttle next waits."""

from __future__ import annotations

import warnings
from typing import Any

from .syncaudit import SyncAudit

__all__ = ["SyncDebug", "sync_debug"]

_MODES = ("warn", "error")


class SyncDebug:
    """Sets ``torch.cuda.set_sync_debug_mode(mode)`` for each step's window, restores it after.

    A window opens when a step is handed out and closes just before the
    throttle waits for room or drains: the loop body *and* whatever the
    framework runs between steps (logging, progress bars, collectives) are
    covered, the throttle's own waits never are. ``.item()``, ``print(tensor)``
    or ``nonzero()`` in the window are then reported by PyTorch; with
    ``"warn"`` they are also counted per step and per site by :attr:`audit`
    (on the loop's thread only: the mode is process-global). Entering an
    open window or leaving a closed one does nothing.
    """

    __slots__ = ("_active", "_cuda", "_mode", "_previous", "audit")

    def __init__(self, mode: str, cuda: Any) -> None:
        self._mode, self._cuda = mode, cuda
        self._previous: Any = 0
        self._active = False
        self.audit = SyncAudit() if mode == "warn" else None

    def __enter__(self) -> None:
        if self._active:
            return
        self._active = True
        self._previous = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode(self._mode)
        if self.audit is not None:
            self.audit.start()

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        self._active = False
        if self.audit is not None:
            self.audit.stop()
        self._cuda.set_sync_debug_mode(self._previous)


def _cuda_backend() -> Any:
    """``torch.cuda`` when a CUDA device is available, else None (tests replace this)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda if torch.cuda.is_available() else None


def sync_debug(mode: str | None, device_kind: str | None) -> SyncDebug | None:
    """The guard for ``detect_sync=mode`` on ``device_kind``, or None (with one warning if unsupported).

    ``device_kind`` None means a custom ``events=`` backend: the guard is made
    when CUDA is available (the events may well be CUDA's).
    """
    if mode is None:
        return None
    if mode not in _MODES:
        raise ValueError(f"detect_sync must be 'warn', 'error' or None, got {mode!r}")
    cuda = _cuda_backend() if device_kind in ("cuda", None) else None
    if cuda is None:
        warnings.warn(
            f"detect_sync={mode!r} needs CUDA (torch.cuda.set_sync_debug_mode); the device here is "
            f"{device_kind or 'a custom events= backend without CUDA'}, so hidden syncs are not detected",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return SyncDebug(mode, cuda)
