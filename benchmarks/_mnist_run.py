"""Run examples/mnist.py's train() once and print one ``RESULT {json}`` line (used by
benchmarks/gpu.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from mnist import parse_args, train  # noqa: E402

from asyncthrottle.backends.pinned import bytes_trusted, pinned_in_use  # noqa: E402


def memory_peaks() -> dict[str, int | None]:
    """Peak pinned host memory held by live blocks and peak device memory allocated; None without
    CUDA stats."""
    if not torch.cuda.is_available():
        return {"pinned_peak_bytes": None, "device_peak_bytes": None}
    # torch >= 2.7
    stats_fn = getattr(torch.cuda, "host_memory_stats", None)
    trusted = bytes_trusted(torch.__version__)
    pinned = None if stats_fn is None else pinned_in_use(stats_fn(), "peak", trust_bytes=trusted)
    return {
        "pinned_peak_bytes": pinned, "device_peak_bytes": int(torch.cuda.max_memory_allocated()),
    }


def main() -> int:
    result = train(parse_args(sys.argv[1:]), log=lambda *a: print(*a, file=sys.stderr))
    stats = result["stats"]
    print("RESULT " + json.dumps({
        "steps_per_s": stats.steps_per_s, "wait_fraction": stats.wait_fraction,
        "idle_fraction": stats.idle_fraction, "max_in_flight": stats.max_in_flight,
        "depth": stats.depth, "depth_changes": stats.depth_changes, "verdict": stats.verdict,
        **memory_peaks(),
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
