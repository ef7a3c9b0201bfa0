"""The script's own ``torch.distributed`` collectives: each call's line, count, time blocked and
whether it runs in the steps (DDP's bucket reductions run in C++, in the backward: not these)."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import Any

from ..audit.frames import TORCH, Frames
from ..audit.patches import Patches
from .logged import only_logged

__all__ = ["CALLS", "Collectives"]

# the collectives heard, as torch.distributed names them
CALLS = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "barrier",
         "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
         "all_to_all_single", "monitored_barrier", "all_gather_object", "broadcast_object_list",
         "gather_object", "scatter_object_list")


class Collectives:
    """Counts the script's calls of :data:`CALLS` by its line (a call made in an installed
    package counts at the script's line, ``via`` the package's; one made in torch's or this
    library's own code not at all), each timed on the host: the whole call, or its launch with
    ``async_op=True``.

    Args:
        roots: the script's folders.
        in_step: whether the script is inside a step now (the sync audit's ``in_step``).
        clock: seconds (``time.perf_counter``).
    """

    def __init__(self, roots: Sequence[str], in_step: Callable[[], bool],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._frames = Frames(roots)
        self._in_step, self.clock = in_step, clock
        # (path, line, call, in_step, via) -> [count, seconds]
        self._counts: dict[tuple[Any, ...], list[float]] = {}
        self.thread = get_ident()

    def install(self, dist: Any, patches: Patches) -> None:
        """Wrap ``dist``'s (``torch.distributed``'s) collectives; ``patches.undo()`` unwraps
        them."""
        import torch

        self._frames.know_torch(torch.__file__)
        for name in CALLS:
            if hasattr(dist, name):
                patches.replace(dist, name, functools.partial(self._wrap, name), eager=True)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if get_ident() != self.thread:
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            # torch's own collectives (DDP's, in Python) are none of the script's
            where = None if self._frames.kind_of(caller.f_code.co_filename) == TORCH else \
                self._frames.where(caller, cuda=False)
            start = self.clock()
            try:
                return original(*args, **kwargs)
            finally:
                if where is not None:
                    self.add(where, name, self.clock() - start)
        return collective

    def add(self, where: tuple[str, int, Any], call: str, seconds: float) -> None:
        """A call of ``call`` at ``where`` (the audit's site) that blocked ``seconds``."""
        key = (where[0], where[1], call, self._in_step(), where[2])
        count = self._counts.setdefault(key, [0, 0.0])
        count[0] += 1
        count[1] += seconds

    def rows(self, steps: int) -> list[dict[str, Any]]:
        """One row a site, call, in/out of steps and ``via``, as the sync audit's rows (``file``:
        the site's absolute path), the most frequent first; ``only_logged``: a call of the
        script's own in the steps whose result is only logged (:func:`~.logged.only_logged`)."""
        rows = []
        for (path, line, call, in_step, via), (count, seconds) in self._counts.items():
            rows.append({
                "site": f"{self._frames.relative(path)}:{line}", "call": call,
                "count": int(count), "per_step": count / steps if steps else 0.0,
                "in_step": in_step, "blocked_s": seconds,
                "blocked_per_step_s": seconds / steps if steps else None,
                "via": None if via is None else f"{self._frames.relative(via[0])}:{via[1]}",
                "file": path, "only_logged": in_step and via is None
                and only_logged(path, line, call)})
        return sorted(rows, key=lambda row: (-row["count"], row["site"]))
