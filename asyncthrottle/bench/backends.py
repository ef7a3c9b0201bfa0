"""The benchmark backends: what one provides, CUDA, the real-time simulated device, and the picker
(JAX lazily)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..backends.torch import resolve_events
from ..core.events import EventFactory
from ..testing.procdevice import ProcessDevice

__all__ = ["BACKENDS", "BenchBackend", "CudaBench", "SimCost", "SimulatedBench", "pick_backend"]


class BenchBackend(Protocol):
    """A device the benchmarks can run the three experiments on (:mod:`.experiments`).

    Attributes:
        name: short label printed beside every figure, e.g. ``"cuda (NVIDIA H200)"``,
            ``"jax-cpu"``, ``"simulated"``.
        simulated: True when the device is a stand-in (results must say so).
    """

    name: str
    simulated: bool

    def events(self) -> EventFactory:
        """The event factory a Throttle on this device uses."""

    def synchronize(self) -> None:
        """Block until every piece of work launched so far has run."""

    def add_one(self) -> Callable[[], None]:
        """One step of the first experiment: ``y = x + 1`` on the device."""

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        """One step of the second experiment: an ``n x n`` matrix product."""

    def train_step(self) -> Callable[[], None]:
        """One step of a small training loop (forward, backward, update)."""

    def close(self) -> None:
        """Release the device's resources."""


class CudaBench:
    """The three workloads on a CUDA GPU, with cheap (non-timing) events.

    Args:
        device: the CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.

    Raises:
        RuntimeError: no CUDA GPU is available.
    """

    simulated = False

    def __init__(self, device: str = "cuda") -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                "--backend cuda needs a CUDA GPU, but torch.cuda.is_available() is False here; "
                "use --backend simulated (or auto)"
            )
        self._torch = torch
        self.device = torch.device(device)
        self.name = f"cuda ({torch.cuda.get_device_name(self.device)})"
        self._events = resolve_events(self.device)
        # a CUDA device always has events
        assert self._events is not None
        self._keep: list[Any] = []

    def events(self) -> EventFactory:
        assert self._events is not None
        return self._events

    def throttle_options(self) -> dict[str, Any]:
        """A Throttle here takes ``device=``: the library's own (pooled) events and default
        options."""
        return {"device": self.device}

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)  # host-device sync: the caller asked for one

    def add_one(self) -> Callable[[], None]:
        # d2l's x (its chapter "Asynchronous Computation")
        x = self._torch.ones((1, 2), device=self.device)

        def step() -> None:
            x + 1

        return step

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        torch = self._torch
        a = torch.randn((n, n), device=self.device)

        def step() -> None:
            # enqueued; the product is not read
            torch.mm(a, a)

        return step

    def train_step(self) -> Callable[[], None]:
        torch = self._torch
        model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))
        model.to(self.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn((256, 784), device=self.device)
        y = torch.randint(0, 10, (256,), device=self.device)
        self._keep.append((model, opt, x, y))

        # no .item(), no host read: nothing here syncs
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    def close(self) -> None:
        self.synchronize()
        self._keep.clear()
        self._torch.cuda.empty_cache()


@dataclasses.dataclass(frozen=True)
class SimCost:
    """A simulated workload: ``launches`` ops per step, each costing the host and the device."""

    host_s: float
    device_s: float
    launches: int = 1

    def __post_init__(self) -> None:
        if not (self.host_s >= 0 and self.device_s >= 0 and self.launches >= 1):
            raise ValueError("a simulated cost needs host_s >= 0, device_s >= 0 and launches >= 1, "
                             f"got {self}")


DEFAULT_COSTS: Mapping[str, SimCost] = {
    "add": SimCost(host_s=10e-6, device_s=100e-6),
    "matmul": SimCost(host_s=15e-6, device_s=1e-3),
    "train": SimCost(host_s=40e-6, device_s=200e-6, launches=3),
}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SimulatedBench:
    """The three workloads on the GIL-free :class:`~asyncthrottle.procdevice.ProcessDevice`.

    Each launch spins the host for ``host_s`` and queues ``device_s`` of work
    on the device process, which completes it without the host's GIL (like a
    GPU), so no GIL switch-interval tuning is needed.

    Args:
        costs: per workload (``"add"``, ``"matmul"``, ``"train"``), overriding the defaults.
    """

    simulated = True
    name = "simulated (real-time child process, not a GPU)"

    def __init__(self, costs: Mapping[str, SimCost] | None = None) -> None:
        unknown = set(costs or ()) - set(DEFAULT_COSTS)
        if unknown:
            raise ValueError(f"unknown simulated workloads {sorted(unknown)}; choose from "
                             f"{sorted(DEFAULT_COSTS)}")
        self.costs = {**DEFAULT_COSTS, **(costs or {})}
        self.device = ProcessDevice()

    def events(self) -> EventFactory:
        return self.device.event

    def synchronize(self) -> None:
        self.device.synchronize()  # host-device sync: waits for the device process

    def _workload(self, cost: SimCost, scale: float = 1.0) -> Callable[[], None]:
        device, host_s, device_s, launches = (
            self.device, cost.host_s, cost.device_s * scale, cost.launches,
        )

        def step() -> None:
            for _ in range(launches):
                _spin(host_s)
                device.launch(device_s)

        return step

    def add_one(self) -> Callable[[], None]:
        return self._workload(self.costs["add"])

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        return self._workload(self.costs["matmul"], scale=(n / 1000) ** 3)

    def train_step(self) -> Callable[[], None]:
        return self._workload(self.costs["train"])

    def close(self) -> None:
        self.device.close()


def _jax_bench(costs: Mapping[str, SimCost] | None) -> BenchBackend:
    try:
        from .jax_backend import JaxBench  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        # jax is an optional extra
        raise RuntimeError(f"--backend jax needs jax ({exc}); pip install 'asyncthrottle[jax]', or "
                           "use --backend simulated") from None
    return JaxBench()


def _jax_available() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# --backend's choices: whether each runs here, and the backend it makes ("auto": the first that runs
# here, in this order); a choice is looked up here, never compared
_CHOICES: dict[str, tuple[Callable[[], bool], Callable[[Mapping[str, SimCost] | None],
                                                      BenchBackend]]] = {
    "cuda": (_cuda_available, lambda costs: CudaBench()),
    "jax": (_jax_available, _jax_bench),
    "simulated": (lambda: True, SimulatedBench),
}
BACKENDS = ("auto", *_CHOICES)


def pick_backend(name: str = "auto", *,
                 sim_costs: Mapping[str, SimCost] | None = None) -> BenchBackend:
    """The backend ``--backend name`` asks for; ``"auto"`` is CUDA > JAX (if installed) > simulated.

    Raises:
        ValueError: an unknown name.
        RuntimeError: an explicit backend that is not available here.
    """
    if name not in BACKENDS:
        raise ValueError(f"--backend must be one of {list(BACKENDS)}, got {name!r}")
    if name == "auto":
        name = next(choice for choice, (available, _) in _CHOICES.items() if available())
    return _CHOICES[name][1](sim_costs)
