"""A CUDA device for the wait sweep: ``torch.cuda._sleep`` kernels calibrated to last a given
time."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["CudaSleepBench"]


class CudaSleepBench:
    """Steps of a chosen length on a real GPU: one spinning kernel each, calibrated in GPU cycles.

    Args:
        device: the CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
        calibrate_cycles: kernel length used to measure the GPU's cycles per second.

    Raises:
        RuntimeError: no CUDA GPU is available.
    """

    def __init__(self, device: str = "cuda", calibrate_cycles: int = 10_000_000) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("--backend cuda needs a CUDA GPU, but torch.cuda.is_available() is "
                               "False here")
        self._torch = torch
        self.device = torch.device(device)
        self.name = f"cuda ({torch.cuda.get_device_name(self.device)}), torch.cuda._sleep kernels"
        self.cycles_per_s = self._calibrate(calibrate_cycles)

    def _calibrate(self, cycles: int) -> float:
        torch = self._torch
        rates = []
        with torch.cuda.device(self.device):
            torch.cuda._sleep(cycles // 10)  # type: ignore[no-untyped-call]  # warm-up: loads the kernel
            for _ in range(5):
                start, end = (
                    torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                )
                start.record()
                torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
                end.record()
                end.synchronize()  # host-device sync: calibration, before any measurement
                rates.append(cycles / (start.elapsed_time(end) / 1000))
        return float(statistics.median(rates))

    def launch(self, seconds: float) -> None:
        """Queue one kernel that keeps the GPU busy for ``seconds``."""
        self._torch.cuda._sleep(max(1, int(seconds * self.cycles_per_s)))  # type: ignore[no-untyped-call]

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)  # host-device sync: between runs

    def throttle_options(self) -> dict[str, Any]:
        # the throttle's own CUDA events (blocking ones for wait="block")
        return {"device": self.device}

    def close(self) -> None:
        self.synchronize()
