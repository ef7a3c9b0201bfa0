"""The device side of :class:`~asyncthrottle.procdevice.ProcessDevice`: a stdlib-only child process.

Run as ``python -I -S _simworker.py CMD_FD SHM_FD SLOTS PARENT_PID``. It reads fixed-size
commands ``(launched_at, seconds)`` from the pipe ``CMD_FD`` (``seconds < 0``: a marker),
executes them in order on a device timeline (each op ends ``seconds`` after the previous
one, or after its launch if the device was idle), and publishes progress in the shared
memory ``SHM_FD``: int64 ``[0]`` ops and markers executed, float64 ``[1]`` busy seconds,
int64 ``[2]`` 1 once ready, then ``SLOTS`` pairs ``(sequence, device time)`` for markers.
It exits on EOF (the parent closed the pipe or died) or when its parent pid changes.
This file imports nothing from the package, so the child starts in milliseconds.
"""

from __future__ import annotations

import mmap
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable

RECORD = struct.Struct("<dd")
# 8-byte words before the marker slots
HEADER = 4
# sleep until this long before an op's end, then spin (sleeps overshoot ~50 us, rarely 250)
SLEEP_MARGIN_S = 3e-4
# how often a blocked or sleeping worker checks that its parent is alive
PARENT_CHECK_S = 0.2


def size_for(slots: int) -> int:
    """Bytes of shared memory for ``slots`` marker slots."""
    return 8 * (HEADER + 2 * slots)


def run(cmd_fd: int, shm_fd: int, slots: int, parent: int) -> None:
    """Execute commands until the pipe closes or the parent goes away."""
    mem = mmap.mmap(shm_fd, size_for(slots))
    words = memoryview(mem).cast("q")
    floats = memoryview(mem).cast("d")
    # CLOCK_MONOTONIC on Linux: the same timeline as the host's
    clock = time.perf_counter
    executed, busy, device_time = 0, 0.0, clock()
    pending = b""
    words[2] = 1
    while True:
        # idle: block, no CPU
        ready, _, _ = select.select([cmd_fd], [], [], PARENT_CHECK_S)
        if os.getppid() != parent:
            return
        if not ready:
            continue
        chunk = os.read(cmd_fd, RECORD.size * 4096)
        if not chunk:
            # EOF: the parent closed the pipe (close()) or died
            return
        pending += chunk
        whole = len(pending) - len(pending) % RECORD.size
        for launched_at, seconds in RECORD.iter_unpack(pending[:whole]):
            # a late wake-up does not lose device time
            device_time = max(device_time, launched_at)
            # a marker: stamp its slot, then publish it as executed
            if seconds < 0:
                slot = HEADER + 2 * (executed % slots)
                words[slot] = executed + 1
                floats[slot + 1] = device_time
            else:
                device_time += seconds
                busy += seconds
                floats[1] = busy
                if not _run_until(device_time, clock, parent):
                    return
            executed += 1
            # last: the slot above is written before the count that publishes it
            words[0] = executed
        pending = pending[whole:]


def _run_until(end: float, clock: Callable[[], float], parent: int) -> bool:
    """Occupy the device until ``end``: sleep most of the way, spin the rest. False if orphaned."""
    now = clock()
    while end - now > SLEEP_MARGIN_S:
        time.sleep(min(end - now - SLEEP_MARGIN_S, PARENT_CHECK_S))
        if os.getppid() != parent:
            return False
        now = clock()
    while clock() < end:
        pass
    return True


def _precise_sleeps() -> None:
    """Ask Linux for exact timer wake-ups (default slack 50 us), so the device sleeps more and spins
    less."""
    try:
        import ctypes

        # PR_SET_TIMERSLACK: 1 ns
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)
    except (OSError, AttributeError):
        # not Linux: the default slack only costs some spinning
        pass


if __name__ == "__main__":
    # Ctrl-C is the host's; the host's close() ends us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _precise_sleeps()
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
