"""Real-time simulated accelerators: a worker thread (here) or a GIL-free child process.

:class:`ProcessDevice` (from :mod:`asyncthrottle.procdevice`, re-exported here) is
the one the benchmarks use: its work completes outside the host interpreter, so
waits are measured faithfully. :class:`SimulatedDevice` completes work on a Python
thread that needs the host's GIL; it stays for tests that want a device in-process.

``launch(seconds)`` costs the host ``launch_s`` and queues ``seconds`` of device
work; both devices keep a device timeline (each op ends ``seconds`` after the previous one, or after
it was launched if the device was idle), so sleep jitter does not accumulate.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from .procdevice import ProcessDevice, ProcessEvent

__all__ = ["ProcessDevice", "ProcessEvent", "SimulatedDevice", "SimulatedEvent"]


class SimulatedEvent:
    """A marker in a :class:`SimulatedDevice`'s queue."""

    __slots__ = ("_device", "_done", "time")

    def __init__(self, device: SimulatedDevice) -> None:
        self._device = device
        self._done: threading.Event | None = None
        # device time at which the marker was reached
        self.time: float | None = None

    def record(self) -> None:
        self._done = threading.Event()
        self._device._enqueue(self)

    def query(self) -> bool:
        return self._done is None or self._done.is_set()

    def synchronize(self) -> None:
        if self._done is not None:
            self._done.wait()

    def elapsed_time(self, end: SimulatedEvent) -> float:
        if self.time is None or end.time is None:
            raise RuntimeError("elapsed_time() needs both events completed")
        return (end.time - self.time) * 1000.0

    def _reach(self, now: float) -> None:
        self.time = now
        assert self._done is not None
        self._done.set()


class SimulatedDevice:
    """A device whose work runs on a worker thread, in launch order, in real time.

    Args:
        launch_s: host seconds each ``launch()`` costs (spent spinning, like a
            kernel launch).
        clock: the clock of the device timeline.

    Attributes:
        launched: ops and markers queued so far (written by the host only).
        executed: ops and markers run so far (written by the worker only).
        busy_s: total device seconds executed.
    """

    def __init__(self, *, launch_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.launch_s = launch_s
        self._clock = clock
        self._queue: queue.SimpleQueue[tuple[float, float | SimulatedEvent] | None] = (
            queue.SimpleQueue())
        self.launched = self.executed = 0
        self.busy_s = 0.0
        self._worker = threading.Thread(target=self._run, name="asyncthrottle-simulated-device",
                                        daemon=True)
        self._worker.start()

    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of device work; the host pays ``launch_s``."""
        if self.launch_s:
            end = self._clock() + self.launch_s
            while self._clock() < end:
                pass
        self._enqueue(seconds)

    def event(self) -> SimulatedEvent:
        """The event factory: ``Throttle(events=device.event)``."""
        return SimulatedEvent(self)

    def synchronize(self) -> None:
        """Wait until all launched work has run."""
        marker = self.event()
        marker.record()
        marker.synchronize()

    def close(self) -> None:
        """Stop the worker once the queued work has run."""
        self._queue.put(None)
        self._worker.join()

    def __enter__(self) -> SimulatedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queued(self) -> int:
        """Ops and markers launched and not yet run."""
        return self.launched - self.executed

    def _enqueue(self, item: float | SimulatedEvent) -> None:
        self.launched += 1
        self._queue.put((self._clock(), item))

    def _run(self) -> None:
        device_time = self._clock()
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            launched_at, item = entry
            # a late worker does not lose device time
            device_time = max(device_time, launched_at)
            if isinstance(item, SimulatedEvent):
                item._reach(device_time)
            else:
                device_time += item
                self.busy_s += item
                remaining = device_time - self._clock()
                if remaining > 0:
                    time.sleep(remaining)
            self.executed += 1
