"""Hidden-sync detection: CUDA's sync debug mode, switched on for the loop body only."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["SyncDebug", "sync_debug"]

_MODES = ("warn", "error")


class SyncDebug:
    """Sets ``torch.cuda.set_sync_debug_mode(mode)`` while the loop body runs, restores it after.

    ``.item()``, ``print(tensor)`` or ``nonzero()`` in the body are then reported
    by PyTorch; the throttle's own waits run outside the body and are never
    reported. The mode is process-global: another thread's syncs during the
    body are reported too.
    """

    __slots__ = ("_cuda", "_mode", "_previous")

    def __init__(self, mode: str, cuda: Any) -> None:
        self._mode, self._cuda = mode, cuda
        self._previous: Any = 0

    def __enter__(self) -> None:
        self._previous = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode(self._mode)

    def __exit__(self, *exc: object) -> None:
        self._cuda.set_sync_debug_mode(self._previous)


def sync_debug(mode: str | None, device_kind: str | None) -> SyncDebug | None:
    """The guard for ``detect_sync=mode`` on ``device_kind``, or None (with one warning if unsupported)."""
    if mode is None:
        return None
    if mode not in _MODES:
        raise ValueError(f"detect_sync must be 'warn', 'error' or None, got {mode!r}")
    if device_kind != "cuda":
        warnings.warn(
            f"detect_sync={mode!r} needs CUDA (torch.cuda.set_sync_debug_mode); the device here is "
            f"{device_kind or 'a custom events= backend'}, so hidden syncs are not detected",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    import torch

    return SyncDebug(mode, torch.cuda)
