"""On CUDA, the host reads its sync debug mode's warnings name, or a sync outside every read."""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING, Any

from ..parts.syncaudit import SyncAudit
from .frames import TORCH

if TYPE_CHECKING:
    from .frames import Frames
    from .syncsites import SyncSites

__all__ = ["CUDA_SYNC", "CudaSyncs"]

# the call name of a sync CUDA reports outside every patched read (an op this audit does not name)
CUDA_SYNC = "CUDA sync"


class CudaSyncs:
    """CUDA's side of :class:`~asyncthrottle.audit.syncsites.SyncSites`: once the script starts
    CUDA, its sync debug mode warns (``"warn"``) and a read counts when it synced (a read inside
    torch's own code at the script's line that called torch), a sync outside every patched read
    as :data:`CUDA_SYNC`. A read is timed from its lookup (``pend``) and its time filed at
    its first sync (its row's ``blocked_s``: the host's wait for the device); a
    :data:`CUDA_SYNC` is not timed.

    Attributes:
        on: True once the script's CUDA has started (its warnings then decide what counts).
    """

    def __init__(self, sites: SyncSites, frames: Frames, cuda: Any = None) -> None:
        """Args:
            sites: the counts (its ``thread``, ``loading`` and ``add()``).
            frames: the script's frames.
            cuda: ``torch.cuda`` (None) or a stand-in with its ``_lazy_call`` and sync debug mode.
        """
        self._sites, self._frames, self._cuda = sites, frames, cuda
        self.on = False
        # the read looked up last (call, its frame's id and line) and the instruction of the
        # frame when it first synced (-1: not yet)
        self._pending: tuple[str, int, int] | None = None
        self._synced_lasti = -1
        self._audit: SyncAudit | None = None
        self._previous_mode: Any = 0

    def watch(self) -> None:
        """Start when the script starts CUDA (now, if CUDA is already initialised); initialises
        nothing."""
        if self._cuda is None:
            import torch

            self._cuda = torch.cuda
        lazy = getattr(self._cuda, "_lazy_call", None)
        if lazy is not None:
            lazy(self._started)

    def stop(self) -> None:
        """Count no more syncs (the warning hook stays until :meth:`off`)."""
        if self._audit is not None:
            self._audit.stop()

    def off(self) -> None:
        """Undo what CUDA's start did (the sync debug mode, the warning hook), or drop the call
        torch's lazy init still holds."""
        if self._audit is not None:
            self._audit.uninstall()
            self._audit = None
        queued = getattr(self._cuda, "_queued_calls", None)
        if isinstance(queued, list):
            queued[:] = [call for call in queued if call[0] != self._started]
        if self.on:
            self._cuda.set_sync_debug_mode(self._previous_mode)
        self.on = False
        self._pending = None

    def pend(self, call: str, frame: FrameType) -> bool:
        """A read looked up by ``frame`` (of the script's thread): kept for CUDA's warning to
        name, at the script's frame that called torch for a read in torch's code. True: kept
        (the read is timed; its first sync files the time it blocked); False: a read inside
        the script's read, which that one names."""
        if self._frames.kind_of(frame.f_code.co_filename) == TORCH:
            caller = self._frames.caller(frame)
            if caller is None or (self._pending is not None and self._synced_lasti < 0 and (
                    self._pending[1:] == (id(caller), caller.f_lineno))):
                return False  # a read inside the script's read (repr's item()): that one names it
            frame = caller
        self._pending, self._synced_lasti = (call, id(frame), frame.f_lineno), -1
        if self._audit is not None:
            self._audit.install()
        return True

    def _started(self) -> None:
        """CUDA initialises (torch's lazy init calls this): its sync warnings now decide."""
        thread = self._sites.thread
        if thread is None or self.on:
            return
        self._previous_mode = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode("warn")
        self.on = True
        self._audit = SyncAudit(on_sync=self._synced_at)
        self._audit.start(new_step=False, thread=thread)

    def _synced_at(self, frame: FrameType | None) -> None:
        """CUDA warned of a sync on the script's thread: the read looked up last on the line
        made it, else count it under :data:`CUDA_SYNC`."""
        if self._sites.loading:
            return
        self._sites.timer.synced()
        where = self._frames.where(frame, cuda=True)
        if where is None:
            return
        call, caller, pending = CUDA_SYNC, self._frames.caller(frame), self._pending
        if caller is not None and pending is not None and (id(caller), caller.f_lineno) == (
                pending[1], pending[2]):
            if caller.f_lasti == self._synced_lasti:
                return  # the same read synced again
            if self._synced_lasti < 0:
                call, self._synced_lasti = pending[0], caller.f_lasti
        self._sites.add(where, call)
