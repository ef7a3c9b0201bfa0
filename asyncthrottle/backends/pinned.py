"""Pinned host memory held by live blocks, read from ``torch.cuda.host_memory_stats()`` on every
torch that has it.

What each torch version reports (read in its ``aten/src/ATen/core/CachingHostAllocator.h``):

* torch < 2.7: no host statistics at all.
* torch 2.7-2.9 (pytorch/pytorch#147660): ``allocation`` / ``allocated_bytes`` count
  blocks handed out to callers (in use), ``segment`` / ``reserved_bytes`` the pool
  (blocks in use plus cached ones).
* torch 2.10 on (pytorch/pytorch#164412): the same two pairs renamed --
  ``active_requests`` / ``active_bytes`` are in use, ``allocations`` /
  ``allocated_bytes`` the pool. So ``allocated_bytes`` changed meaning.
* Until the fix that torch 2.14 carries (pytorch/pytorch#179380, merged as
  #171662), a block released once its copy's event completes -- every block a
  ``non_blocking`` copy used -- lowered the in-use *bytes* by the function's
  ``size`` argument, which is -1 there: the figure rose by each block's size and
  never fell (seen on torch 2.11). The in-use block *count* and the pool
  figures were right. torch 2.12 and 2.13 were not read: treated as before.

So the in-use bytes are read directly only where they are known to be right
(torch >= 2.14) and while they do not exceed the pool; elsewhere they are
estimated as blocks in use times the pool's mean block size (exact when the
blocks are of one size, as a loop's batches are; never more than the pool).
``{}`` (CUDA not initialised, or nothing pinned yet) reads 0.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

_log = logging.getLogger("asyncthrottle")
# log_untrusted() has spoken
_said = False

# the first torch whose in-use byte count was read and found right
BYTES_TRUSTED_FROM = (2, 14)
# (in use bytes, in use blocks, pool bytes, pool blocks) in each naming
_NAMES = (
    # torch 2.10 on
    ("active_bytes", "active_requests", "allocated_bytes", "allocations"),
    # torch 2.7-2.9
    ("allocated_bytes", "allocation", "reserved_bytes", "segment"),
)


def flatten(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The nested form (``{"active_bytes": {"current": 1}}``) flat, as
    ``{"active_bytes.current": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{sub}": v for sub, v in flatten(value).items()})
        else:
            flat[key] = value
    return flat


def bytes_trusted(version: str) -> bool:
    """Whether torch ``version``'s in-use byte count can be read as is (see the module
    docstring)."""
    parts = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= BYTES_TRUSTED_FROM


def pinned_in_use(
    stats: Mapping[str, Any], which: str = "current", *, trust_bytes: bool = True
) -> int:
    """Pinned host bytes held by live blocks, from ``host_memory_stats()`` (flat or nested).

    Args:
        stats: what ``torch.cuda.host_memory_stats()`` (or its nested form) returned.
        which: ``"current"``, or ``"peak"``.
        trust_bytes: read the in-use byte count as is (torch >= 2.14, see
            :func:`bytes_trusted`); False estimates it from block counts. Either
            way a byte count above the pool's is not believed.

    Returns:
        The bytes; 0 for ``{}``. For ``"peak"`` without trusted bytes, the
        pool's peak (an upper bound: no peak of blocks in use is kept).
    """
    flat = flatten(stats)
    naming = next(
        (
            names
            for names in _NAMES
            if f"{names[0]}.{which}" in flat or f"{names[1]}.current" in flat
        ),
        None,
    )
    if naming is None:
        return 0
    used, blocks, pool, pool_blocks = (flat.get(f"{name}.{which}") for name in naming)
    pool = int(pool) if pool is not None else None
    if trust_bytes and used is not None and (pool is None or used <= pool):
        return int(used)
    if which != "current" or not pool or not pool_blocks or blocks is None:
        return pool or 0
    return min(pool, round(int(blocks) * pool / int(pool_blocks)))


def log_untrusted(version: str) -> None:
    """Say (once per process) that this torch's in-use byte count is estimated, not read."""
    global _said
    if _said:
        return
    _said = True
    _log.warning(
        "asyncthrottle: torch %s's host_memory_stats() in-use byte count of pinned memory cannot "
        "be trusted (it never falls after a non_blocking copy before torch %d.%d); max_memory's "
        "CUDA probe estimates it from the blocks in use times the pool's mean block size",
        version, *BYTES_TRUSTED_FROM,
    )
