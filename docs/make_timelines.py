"""Make the pictures of docs/timelines.md on the simulated device (real time, a GIL-free child
process; not a GPU).

    python docs/make_timelines.py            # writes docs/img/timeline-*.png (needs matplotlib)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncthrottle as at
from asyncthrottle.plot import plot_trace
from asyncthrottle.testing.procdevice import ProcessDevice

OUT = Path(__file__).resolve().parent / "img"
# name: (fetch ms, host body ms, device ms) per step
LOOPS = {
    "device-bound": (0.2, 1.0, 4.0), "input-bound": (4.0, 1.0, 1.0),
}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _source(n: int, fetch_s: float) -> Iterator[int]:
    for i in range(n):
        # loading in the main process (num_workers=0): the GIL is held
        _spin(fetch_s)
        yield i


def make(name: str, steps: int = 150, depth: int = 2) -> Path:
    fetch_ms, body_ms, device_ms = LOOPS[name]
    with ProcessDevice() as device:
        thr = at.Throttle(depth, events=device.event, trace=steps)
        for _ in thr.wrap(_source(steps, fetch_ms / 1000)):
            # Python and kernel launches
            _spin(body_ms / 1000)
            device.launch(device_ms / 1000)
    trace = OUT / f"timeline-{name}.json"
    thr.export_trace(trace)
    png = OUT / f"timeline-{name}.png"
    title = (f"SIMULATED device, {name} loop: fetch {fetch_ms:g} ms, host body {body_ms:g} ms, "
             f"device {device_ms:g} ms per step")
    plot_trace(trace, png, title=title)
    trace.unlink()
    print(f"{png}: {thr.stats.verdict}; {png.stat().st_size // 1024} KB")
    return png


if __name__ == "__main__":
    # the simulated worker needs the GIL to finish work; a GPU does not
    sys.setswitchinterval(5e-5)
    for loop in LOOPS:
        make(loop)
