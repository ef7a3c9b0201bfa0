"""The first experiment's ``y = x + 1`` with ``y`` kept on the host every step: the throttle's
``defer()`` against the 15-line pooled-event reference that copies ``y`` into its own pinned ring.

``bench --values --backend cuda`` prints it after its MaxText table, at depth 1 and 2, as the
throttle's speed over the reference of the same depth in each interleaved round (the #26 target:
>= 0.92x). Both loops read the same element of ``y`` on the host once its step completed:

* ``defer``: ``Throttle(depth, device=...)``, ``thr.defer(y, name="y")`` every step, the value
  written by an ``on_complete`` callback (the library's pinned ring of snapshots, its pooled
  events, its default telemetry);
* ``reference``: ``depth + 1`` events and ``depth + 1`` pinned host buffers made once; each step
  copies ``y`` into its slot (``copy_(y, non_blocking=True)``) and re-records its event; before
  step ``n`` the event of step ``n - depth`` is queried, synchronized if unfinished, and its slot
  read.

The loops take the device, the event factory and whether to pin as arguments, so the suite runs
them on the CPU with no-op events (``tests/tools/test_bench.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ..core.events import EventFactory
from ..throttle import Throttle

__all__ = ["DEPTHS", "add_one_loops"]

DEPTHS = (1, 2)


def add_one_loops(device: Any, new_event: EventFactory, options: Mapping[str, Any], *,
               pin: bool, logged: list[float]) -> dict[str, Callable[[int], None]]:
    """``"defer N"`` and ``"reference N"`` for each depth in :data:`DEPTHS`; each appends every
    step's ``y[0, 0]`` to ``logged``, in step order.

    ``options`` make the throttle (``{"device": device}`` on CUDA); ``new_event`` makes the
    reference's events.
    """
    import torch

    # d2l's x, as the first experiment's
    x = torch.ones((1, 2), device=device)

    def deferred(depth: int) -> Callable[[int], None]:
        def loop(n: int) -> None:
            thr = Throttle(depth, **options)
            thr.on_complete(lambda step, values: logged.append(float(values["y"][0, 0])))
            for _ in thr.wrap(range(n)):
                thr.defer(x + 1, name="y")

        return loop

    def reference(depth: int) -> Callable[[int], None]:
        def loop(n: int) -> None:
            slots = depth + 1
            events = [new_event() for _ in range(slots)]
            ring = [torch.empty((1, 2), pin_memory=pin) for _ in range(slots)]
            pending: deque[int] = deque()
            for step in range(n):
                # the bound: step - depth completes before step starts
                while len(pending) >= depth:
                    done = pending.popleft() % slots
                    if not events[done].query():
                        events[done].synchronize()  # host-device sync: the bound requires it
                    logged.append(float(ring[done][0, 0]))
                slot = step % slots
                ring[slot].copy_(x + 1, non_blocking=True)
                events[slot].record()
                pending.append(step)
            while pending:
                done = pending.popleft() % slots
                events[done].synchronize()  # host-device sync: the end of the loop
                logged.append(float(ring[done][0, 0]))

        return loop

    loops: dict[str, Callable[[int], None]] = {}
    for depth in DEPTHS:
        loops[f"defer {depth}"] = deferred(depth)
        loops[f"reference {depth}"] = reference(depth)
    return loops
