"""A real-time simulated accelerator without the GIL: work runs in a child process.

The thread-based :class:`~asyncthrottle.simulated.SimulatedDevice` completes work
on a Python thread that needs the host's GIL, so a host spinning in Python delays
the very completion it waits for. Here the device is a separate process (the
stdlib-only ``_simworker.py``): ``launch()`` writes a 16-byte command to a pipe,
completion is a counter in shared memory, so ``query()`` is a memory read with no
GIL hand-off and no syscall, like a CUDA event's. Linux and other POSIX systems.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from . import _simworker

__all__ = ["ProcessDevice", "ProcessEvent"]

_WORKER = str(Path(_simworker.__file__).resolve())
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class ProcessEvent:
    """A marker in a :class:`ProcessDevice`'s queue; ``query()`` reads shared memory."""

    __slots__ = ("_device", "_seq", "_words")

    def __init__(self, device: ProcessDevice) -> None:
        self._device = device
        self._words = device._words
        # the marker's position in the device queue (0: never recorded)
        self._seq = 0

    def record(self) -> None:
        self._seq = self._device._enqueue(-1.0)

    def query(self) -> bool:
        return bool(self._words[0] >= self._seq)

    def synchronize(self) -> None:
        self._device._wait_for(self._seq)  # host-device sync: the caller asked to block

    def elapsed_time(self, end: ProcessEvent) -> float:
        """Milliseconds between two completed markers, from the device's own timestamps."""
        return (end._device._stamp(end._seq) - self._device._stamp(self._seq)) * 1000.0


class ProcessDevice:
    """A device whose work runs in a child process, in launch order, in real time.

    Use it as a context manager (or call :meth:`close`). The child also exits
    when the host process dies or closes the pipe, so no process is left behind.

    Args:
        launch_s: host seconds each ``launch()`` costs, spent spinning (like a
            kernel launch), on top of the pipe write (a few microseconds).
        slots: markers whose device timestamps are kept for ``elapsed_time``.
        clock: the host clock stamped on each launch; must be ``time.perf_counter``'s
            timeline (the child uses ``time.perf_counter``).
        start_timeout_s: seconds to wait for the child to start.

    Raises:
        RuntimeError: the child did not start, or died while waited for.
    """

    def __init__(
        self,
        *,
        launch_s: float = 0.0,
        slots: int = 1 << 16,
        clock: Callable[[], float] = time.perf_counter,
        start_timeout_s: float = 30.0,
    ) -> None:
        if launch_s < 0 or slots < 1:
            raise ValueError(f"launch_s must be >= 0 and slots >= 1, got launch_s={launch_s!r}, "
                             f"slots={slots!r}")
        self.launch_s, self._slots, self._clock = launch_s, slots, clock
        self.launched = 0
        self._shm = tempfile.TemporaryFile()
        self._shm.truncate(_simworker.size_for(slots))
        self._mem = mmap.mmap(self._shm.fileno(), _simworker.size_for(slots))
        self._words = memoryview(self._mem).cast("q")
        self._floats = memoryview(self._mem).cast("d")
        read_fd, self._fd = os.pipe()
        try:
            # room for 65536 queued commands
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            # the default 64 KiB: launches block beyond 4096 queued, like a full launch queue
            pass
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable, "-I", "-S", _WORKER, str(read_fd), str(self._shm.fileno()),
                    str(slots), str(os.getpid()),
                ],
                pass_fds=(read_fd, self._shm.fileno()),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(read_fd)
        self._finalizer = weakref.finalize(self, _kill, self._proc, self._fd)
        deadline = time.monotonic() + start_timeout_s
        while self._words[2] != 1:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._finalizer()
                raise RuntimeError(
                    "the simulated device's process did not start within "
                    f"start_timeout_s={start_timeout_s!r} (exit status {self._proc.returncode}); "
                    f"is {sys.executable!r} able to run {_WORKER!r}?"
                )
            time.sleep(1e-3)

    # -- the host side --------------------------------------------------------

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of device work; the host pays ``launch_s`` and a pipe write."""
        if seconds < 0:
            raise ValueError(f"launch() needs seconds >= 0, got {seconds!r}")
        if self.launch_s:
            end = self._clock() + self.launch_s
            while self._clock() < end:
                pass
        self._enqueue(seconds)

    def event(self) -> ProcessEvent:
        """The event factory: ``Throttle(events=device.event)``."""
        return ProcessEvent(self)

    def synchronize(self) -> None:
        """Wait until all launched work has run (spinning on shared memory)."""
        self._wait_for(self.launched)  # host-device sync: the caller asked to block

    @property
    def executed(self) -> int:
        """Ops and markers run so far."""
        return int(self._words[0])

    @property
    def queued(self) -> int:
        """Ops and markers launched and not yet run."""
        return self.launched - self.executed

    @property
    def busy_s(self) -> float:
        """Device seconds executed so far."""
        return float(self._floats[1])

    @property
    def alive(self) -> bool:
        """Whether the device process is running."""
        return self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The device process's id."""
        return self._proc.pid

    def close(self, *, wait: bool = True, timeout_s: float = 10.0) -> None:
        """Stop the device: by default once the queued work has run, else at once. Idempotent."""
        if not self._finalizer.alive:
            return
        if wait and self.alive:
            # EOF after the queued commands: the child runs them, then exits
            os.close(self._fd)
            self._fd = -1
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self._finalizer.detach()
        _kill(self._proc, self._fd)

    def __enter__(self) -> ProcessDevice:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # after an error or Ctrl-C, do not run the rest of the queue
        self.close(wait=kind is None)

    # -- internals --------------------------------------------------------------

    def _enqueue(self, seconds: float) -> int:
        if self._fd < 0:
            raise RuntimeError("the simulated device is closed; create a new ProcessDevice")
        os.write(self._fd, _simworker.RECORD.pack(self._clock(), seconds))
        self.launched += 1
        return self.launched

    def _wait_for(self, seq: int) -> None:
        words, spins = self._words, 0
        while words[0] < seq:
            spins += 1
            if spins & 0xFFFF == 0 and self._proc.poll() is not None:
                raise RuntimeError(
                    f"the simulated device's process exited (status {self._proc.returncode}) "
                    f"with {seq - words[0]} ops and markers unrun"
                )

    def _stamp(self, seq: int) -> float:
        if seq == 0 or self._words[0] < seq:
            raise RuntimeError("elapsed_time() needs both events recorded and completed")
        slot = _simworker.HEADER + 2 * ((seq - 1) % self._slots)
        if self._words[slot] != seq:
            raise RuntimeError("the marker's timestamp was overwritten: read elapsed_time() within "
                               f"slots={self._slots} ops of the marker, or create the device with "
                               "more slots")
        return float(self._floats[slot + 1])


def _kill(proc: subprocess.Popen[bytes], fd: int) -> None:
    """End the child now (also run at interpreter exit and when the device is collected)."""
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()
