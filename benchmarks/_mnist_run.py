"""Run examples/mnist.py's train() once and print one ``RESULT {json}`` line (used by benchmarks/gpu.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from mnist import parse_args, train  # noqa: E402


def pinned_peak_bytes() -> int | None:
    """Peak page-locked host memory from torch's caching host allocator; None where torch lacks the stats."""
    stats_fn = getattr(torch.cuda, "host_memory_stats", None)
    if stats_fn is None or not torch.cuda.is_available():
        return None
    try:
        stats: dict[str, Any] = dict(stats_fn())
    except (RuntimeError, AttributeError):
        return None
    flat: dict[str, Any] = {}
    for key, value in stats.items():  # some versions nest {"allocated_bytes": {"peak": n}}, others flatten
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key in ("allocated_bytes.peak", "allocated_bytes.all.peak", "reserved_bytes.peak",
                "reserved_bytes.all.peak", "segment.peak", "allocations.peak"):
        if isinstance(flat.get(key), int):
            return int(flat[key])
    peaks = [v for k, v in flat.items() if "bytes" in k and "peak" in k and isinstance(v, int)]
    return max(peaks) if peaks else None


def main() -> int:
    result = train(parse_args(sys.argv[1:]), log=lambda *a: print(*a, file=sys.stderr))
    stats = result["stats"]
    print("RESULT " + json.dumps({
        "steps_per_s": stats.steps_per_s, "wait_fraction": stats.wait_fraction,
        "idle_fraction": stats.idle_fraction, "max_in_flight": stats.max_in_flight,
        "depth": stats.depth, "depth_changes": stats.depth_changes,
        "pinned_peak_bytes": pinned_peak_bytes(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
