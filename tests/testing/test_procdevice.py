"""The GIL-free simulated device: ordering, device timestamps, throttling, clean-up, no orphans.

These run in real time but never sleep: they wait on the device itself (synchronize)
or on a process's exit (a pidfd becomes readable when the process ends). They assert
nothing a busy machine can break: a launch clock stuck at the first launch makes the
device's timestamps exact, one wait is enough, and an exit has a minute to happen.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from asyncthrottle import Throttle
from asyncthrottle.testing.simulated import ProcessDevice

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds to watch a process exit")


def _exits_within(pid: int, seconds: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already gone
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def _frozen_clock() -> Callable[[], float]:
    """A launch clock stuck at its first reading: the device never idles between ops, however late a busy host is."""
    first: list[float] = []

    def clock() -> float:
        if not first:
            first.append(time.perf_counter())
        return first[0]

    return clock


def test_markers_complete_in_order_with_device_timestamps() -> None:
    with ProcessDevice(clock=_frozen_clock()) as dev:
        first = dev.event()
        first.record()
        for _ in range(5):
            dev.launch(2e-3)
        last = dev.event()
        last.record()
        assert dev.launched == 7
        last.synchronize()
        assert first.query() and last.query() and dev.queued == 0 and dev.executed == 7
        assert first.elapsed_time(last) == pytest.approx(10.0)  # device time: ops end back to back
        assert dev.busy_s == pytest.approx(10e-3)


def test_an_unrecorded_event_is_complete_and_elapsed_time_needs_completion() -> None:
    with ProcessDevice() as dev:
        assert dev.event().query()
        dev.launch(60.0)
        a, b = dev.event(), dev.event()
        a.record()
        b.record()
        assert not b.query()
        with pytest.raises(RuntimeError, match="recorded and completed"):
            a.elapsed_time(b)
        dev.close(wait=False)


def test_overwritten_timestamps_are_reported() -> None:
    with ProcessDevice(slots=2) as dev:
        a = dev.event()
        a.record()
        for _ in range(3):
            dev.launch(0.0)
        b = dev.event()
        b.record()
        dev.synchronize()
        with pytest.raises(RuntimeError, match="overwritten"):
            a.elapsed_time(b)


def test_a_throttle_bounds_the_queue_on_the_device() -> None:
    with ProcessDevice() as dev:
        thr = Throttle(2, events=dev.event, wait="hybrid")
        for _ in thr.wrap(range(50)):
            dev.launch(1e-4)
            assert dev.queued <= 4  # two steps: an op and a marker each
        assert thr.stats.max_in_flight == 2 and dev.queued == 0


def test_default_telemetry_reads_the_device_timeline_through_hybrid_waits() -> None:
    from asyncthrottle.core.waits import Hybrid

    with ProcessDevice(clock=_frozen_clock()) as dev:
        wait = Hybrid(min_samples=1)
        thr = Throttle(2, events=dev.event, wait=wait)  # default sample_every=8: steps 8, ..., 32
        for _ in thr.wrap(range(40)):
            dev.launch(1e-3)
        stats = thr.stats
    assert stats.device_samples == 4 and stats.max_in_flight == 2  # step 0: events= are timed once seen timeable
    assert stats.device_ms_p50 == pytest.approx(1.0)  # the device's own timestamps: ops back to back
    # How many of the 38 hand-outs find their step unfinished depends on the host's scheduling, not on the rule; so
    # does the prediction's size: a wait whose step completes during its first nap records its lower bound, 0 (the
    # step was last seen unfinished at the wait's start), and on a busy host a quarter of them may.
    predicted = wait.predict()
    assert stats.waits >= 1 and predicted is not None and predicted >= 0  # the waits were timed


def test_close_runs_the_queue_then_ends_the_process() -> None:
    dev = ProcessDevice()
    dev.launch(1e-3)
    dev.close()
    assert not dev.alive and dev.executed == 1
    dev.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        dev.launch(1e-3)


def test_an_exception_kills_the_process_without_running_the_queue() -> None:
    with pytest.raises(KeyboardInterrupt), ProcessDevice() as dev:
        dev.launch(60.0)
        pid = dev.pid
        raise KeyboardInterrupt
    assert _exits_within(pid, 60.0)
    assert not dev.alive


def test_invalid_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="launch_s must be >= 0"):
        ProcessDevice(launch_s=-1.0)
    with ProcessDevice() as dev, pytest.raises(ValueError, match="seconds >= 0, got -1"):
        dev.launch(-1)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_no_orphan_when_the_host_is_killed(busy: bool) -> None:
    script = (
        "import os, signal, sys\n"
        "from asyncthrottle.testing.procdevice import ProcessDevice\n"
        "dev = ProcessDevice()\n"
        f"if {busy}: dev.launch(60.0)\n"
        "print(dev.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert proc.returncode == -9, proc.stderr
    assert _exits_within(int(proc.stdout.split()[0]), 60.0)  # it polls its parent every 0.2 s
