"""``to=`` against the two usual host-to-device copies, on a device-bound loop with large batches.

Run it from the source tree as ``python benchmarks/prefetch.py --backend cuda`` (it was ``bench
--prefetch``: the project's comparison with apex's prefetcher, so it is not in the wheel). Every
mode reads the same batches (``--batch-mib`` MiB of float32 each, made once)
from a ``DataLoader`` with ``num_workers=0`` and runs the same step: a
reduction over the batch, then ``torch.cuda._sleep`` for ``--device-ms`` (the
device-bound part), under a throttle of ``--depth`` with
``detect_sync="warn"`` (the sync audit covers the body and the fetch, where
the copies are issued):

* ``to``: ``throttle(DataLoader(pin_memory=False), to=device)``;
* ``apex``: the hand-written prefetcher of NVIDIA apex's ImageNet example
  (next batch copied on a side stream, ``wait_stream`` + ``record_stream`` at
  hand-out) over ``DataLoader(pin_memory=True)``;
* ``non_blocking``: ``x.to(device, non_blocking=True)`` in the body over
  ``DataLoader(pin_memory=True)``; and the same at ``depth=None``, which shows
  what the pinned memory costs with nothing bounding it.

Modes run interleaved ``--repeat`` times; the median steps/s is kept. Pinned
memory is read every 100 steps: the ring's bytes (``stats.pinned_bytes``) and
torch's pinned memory in use (``host_memory_stats()``, torch >= 2.7). On
``--backend cpu`` (a smoke run: nothing overlaps) ``apex`` is skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncthrottle import Throttle
from asyncthrottle.backends.pinned import bytes_trusted, pinned_in_use

__all__ = ["MODES", "ApexPrefetcher", "main", "measure"]

MODES = ("to", "apex", "non_blocking", "non_blocking_depth_none")


class ApexPrefetcher:
    """NVIDIA apex's ImageNet ``data_prefetcher``, as copied into many repositories (tuples of
    tensors)."""

    def __init__(self, loader: Any, device: Any) -> None:
        import torch

        self._torch, self._device, self._it = torch, device, iter(loader)
        self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._next: Any = None
        self._preload()

    def _preload(self) -> None:
        try:
            batch = next(self._it)
        except StopIteration:
            self._next = None
            return
        with self._torch.cuda.stream(self._stream):
            self._next = tuple(t.to(self._device, non_blocking=True) for t in batch)

    def __iter__(self) -> Iterator[Any]:
        while True:
            current = self._torch.cuda.current_stream(self._device)
            # the whole side stream, as apex does
            current.wait_stream(self._stream)
            batch = self._next
            if batch is None:
                return
            for tensor in batch:
                tensor.record_stream(current)
            self._preload()
            yield batch


class _Batches:
    """A map-style dataset whose items are whole batches (use ``batch_size=None``); ``k`` distinct
    ones."""

    def __init__(self, batches: list[Any], steps: int) -> None:
        self.batches, self.steps = batches, steps

    @classmethod
    def make(cls, torch: Any, nbytes: int, steps: int, k: int = 4) -> _Batches:
        rows = max(1, nbytes // (4 * 4096))
        return cls([(torch.randn(rows, 4096), torch.arange(rows)) for _ in range(k)], steps)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> Any:
        return self.batches[i % len(self.batches)]


def measure(mode: str, args: argparse.Namespace, data: _Batches,
            launch: Callable[[float], None]) -> dict[str, Any]:
    """One run of ``mode``: steps/s, syncs per step, pinned bytes sampled every 100 steps."""
    import torch

    device = torch.device(args.device)
    pin = mode != "to" and device.type == "cuda"
    # a map-style dataset by protocol (no torch import at module level)
    dataset: Any = data
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0,
                                         pin_memory=pin)
    source: Any = ApexPrefetcher(loader, device) if mode == "apex" else loader
    depth = None if mode == "non_blocking_depth_none" else args.depth
    audit = "warn" if device.type == "cuda" else None
    thr = Throttle(depth, device=device, detect_sync=audit, sample_every=None)
    ring, host = [], []
    trusted = bytes_trusted(torch.__version__)
    acc = torch.zeros((), device=device)
    start = time.perf_counter()
    for step, (x, y) in enumerate(thr.wrap(source, to=device if mode == "to" else None)):
        if mode.startswith("non_blocking"):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # the step reads its whole batch
        acc += x.sum() + y.sum()
        launch(args.device_ms / 1000)
        if step % 100 == 99:
            ring.append(thr.stats.pinned_bytes)
            # counters: no sync
            stats = torch.cuda.host_memory_stats() if device.type == "cuda" else {}
            host.append(pinned_in_use(stats, trust_bytes=trusted))
    # the pass drained at its end
    wall = time.perf_counter() - start
    audited = thr.sync_audit
    return {
        "mode": mode, "depth": depth, "steps_per_s": len(data) / wall,
        "syncs_per_step": audited.syncs_per_step if audited is not None else None,
        "ring_bytes": ring, "pinned_in_use": host, "max_in_flight": thr.stats.max_in_flight,
    }


def _report(runs: dict[str, list[dict[str, Any]]], batch_bytes: int,
            args: argparse.Namespace) -> list[str]:
    rate = {mode: statistics.median(r["steps_per_s"] for r in rs) for mode, rs in runs.items()}
    mib = 2**20
    lines = [f"{'mode':<26}{'depth':>6}{'steps/s':>10}{'syncs/step':>12}"
             f"{'pinned in use, max MiB':>24}{'ring MiB (first..last)':>24}"]
    for mode, rs in runs.items():
        last = rs[-1]
        syncs = ("-" if last["syncs_per_step"] is None
                 else f"{max(r['syncs_per_step'] for r in rs):.2f}")
        used = max((max(r["pinned_in_use"], default=0) for r in rs), default=0) / mib
        ring = last["ring_bytes"]
        ring_text = f"{ring[0] / mib:.1f}..{ring[-1] / mib:.1f}" if ring and ring[-1] else "-"
        lines.append(f"{mode:<26}{last['depth']!s:>6}{rate[mode]:>10.1f}{syncs:>12}{used:>24.1f}{ring_text:>24}")
    bound = (args.depth + 2) * batch_bytes
    ring_max = max((max(r["ring_bytes"], default=0) for r in runs.get("to", [])), default=0)
    flat = all(len(set(r["ring_bytes"][1:])) <= 1 for r in runs.get("to", []))
    lines.append(f"target: ring <= (depth+2) x batch = {bound / mib:.1f} MiB: {ring_max <= bound} "
                 f"({ring_max / mib:.1f} MiB), flat after the first 100 steps: {flat}")
    for other in ("apex", "non_blocking"):
        if other in rate and "to" in rate:
            lines.append(f"target: to= / {other} = {rate['to'] / rate[other]:.3f}x (>= 1.0)")
    audited = [r["syncs_per_step"] for r in runs.get("to", []) if r["syncs_per_step"] is not None]
    if audited:
        lines.append(f"target: to= syncs/step = {max(audited):.2f} (0)")
    return lines


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/prefetch.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run, figures mean nothing")
    p.add_argument("--steps", type=int, default=1000, help="steps per run (default 1000)")
    p.add_argument("--batch-mib", type=float, default=8.0,
                   help="MiB per batch (default 8; the target needs >= 4)")
    p.add_argument("--device-ms", type=float, default=3.0,
                   help="device time per step (default 3 ms)")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2,
                   help="interleaved runs per mode; the median is kept")
    p.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the prefetch comparison; returns the exit status."""
    args = _parser().parse_args(argv)
    import torch

    if args.backend == "cuda" and not torch.cuda.is_available():
        print("error: --backend cuda needs a CUDA GPU (torch.cuda.is_available() is False here); "
              "--backend cpu runs the same loops as a smoke test", file=sys.stderr)
        return 2
    args.device = "cuda" if args.backend == "cuda" else "cpu"
    modes = [m for m in args.modes.split(",")
             if m in MODES and (args.backend == "cuda" or m != "apex")]
    launch: Callable[[float], None] = lambda seconds: None  # noqa: E731
    if args.backend == "cuda":
        from asyncthrottle.bench.cuda_sleep import CudaSleepBench

        launch = CudaSleepBench(args.device).launch
    batch_bytes = int(args.batch_mib * 2**20)
    data = _Batches.make(torch, batch_bytes, args.steps)
    batch_bytes = sum(t.numel() * t.element_size() for t in data.batches[0])
    # warm-up: CUDA context, kernels, allocators, pinned pools
    for mode in modes:
        measure(mode, args, _Batches(data.batches, min(50, args.steps)), launch)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:
            runs[mode].append(measure(mode, args, data, launch))
            # as it goes
            print(f"# {mode}: {runs[mode][-1]['steps_per_s']:.1f} steps/s", file=sys.stderr,
                  flush=True)
    if args.json:
        print(json.dumps({"batch_bytes": batch_bytes, "args": vars(args), "runs": runs}, indent=2))
        return 0
    print(f"benchmarks/prefetch.py: {args.backend}, {batch_bytes / 2**20:.1f} MiB batches, "
          f"{args.device_ms} ms of device work per step, {args.steps} steps, median of "
          f"{args.repeat}; torch {torch.__version__}")
    lines = _report(runs, batch_bytes, args)
    print("\n".join(lines if args.backend == "cuda"
                    else [*lines[: len(runs) + 1], "(cpu: a smoke run, no targets)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
