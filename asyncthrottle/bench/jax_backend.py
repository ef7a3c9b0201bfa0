"""The benchmark backend on JAX: real asynchronous dispatch, on any machine with jax."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends.jax import _jax, jax_events, parse_jax_device
from ..core.events import EventFactory

__all__ = ["JaxBench"]


class _TrainStep:
    """One SGD step of a small MLP regression; ``loss`` is the latest (unread) loss array."""

    def __init__(self, jax: Any, device: Any, key: Any, width: int = 256, batch: int = 256) -> None:
        jnp = jax.numpy
        k1, k2, k3 = jax.random.split(key, 3)
        put = jax.device_put
        self.params = put(
            {"w1": jax.random.normal(k1, (width, width)) / width**0.5, "w2": jnp.zeros((width, 1))},
            device,
        )
        self.x = put(jax.random.normal(k2, (batch, width)), device)
        self.y = put(jnp.sin(self.x[:, :1]) + 0.1 * jax.random.normal(k3, (batch, 1)), device)
        self.loss: Any = None

        def loss_fn(params: Any, x: Any, y: Any) -> Any:
            hidden = jnp.tanh(x @ params["w1"])
            return jnp.mean((hidden @ params["w2"] - y) ** 2)

        def sgd(params: Any, x: Any, y: Any) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss

        self._sgd = jax.jit(sgd)

    def __call__(self) -> None:
        # dispatch only: never reads a value
        self.params, self.loss = self._sgd(self.params, self.x, self.y)


class JaxBench:
    """The three workloads on a JAX device (the CPU when there is no GPU).

    Each workload returns a zero-argument callable that dispatches one step and
    returns at once; XLA runs it asynchronously (at most 32 programs in flight).

    Args:
        device: None or ``"jax"`` (the first of ``jax.devices()``), ``"jax:N"``,
            or a ``jax.Device``.
        key: the ``jax.random.key`` of the random inputs.

    Raises:
        ImportError: jax is not installed.
    """

    simulated = False

    def __init__(self, device: Any = None, *, key: int = 0) -> None:
        self._jax = _jax()
        self._device = parse_jax_device(self._jax, device)
        self.name = f"jax-{self._device.platform} (XLA, asynchronous dispatch)"
        self._key = self._jax.random.key(key)
        # each workload's latest output, for synchronize()
        self._latest: dict[str, Any] = {}
        self._events = jax_events(self._device)

    def events(self) -> EventFactory:
        """Barrier events on this backend's device (see :func:`asyncthrottle.jax.jax_events`)."""
        return self._events

    def synchronize(self) -> None:
        """Block until every step dispatched so far has run (a host-device sync)."""
        latest = [v.params if isinstance(v, _TrainStep) else v for v in self._latest.values()]
        self._jax.block_until_ready(latest)  # host-device sync: the caller asked for one
        barrier = self._events()
        barrier.record()
        barrier.synchronize()  # host-device sync: also any other work queued on the device

    def add_one(self) -> Callable[[], None]:
        """``y = x + 1`` on a 1 x 2 array, as in d2l."""
        jnp = self._jax.numpy
        x = self._jax.device_put(jnp.ones((1, 2)), self._device)
        add = self._jax.jit(lambda a: a + 1)
        return lambda: self._keep("add_one", add(x))

    def matmul(self, n: int = 1000) -> Callable[[], None]:
        """``y = a @ a`` for a random ``n x n`` float32 matrix ``a``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"matmul(n) needs an int n >= 1 (the matrix size), got {n!r}")
        self._key, key = self._jax.random.split(self._key)
        a = self._jax.device_put(self._jax.random.normal(key, (n, n)), self._device)
        product = self._jax.jit(lambda m: m @ m)
        return lambda: self._keep("matmul", product(a))

    def train_step(self) -> _TrainStep:
        """One SGD step (forward, backward, update) of a 256-wide MLP on a fixed batch."""
        self._key, key = self._jax.random.split(self._key)
        step = _TrainStep(self._jax, self._device, key)
        # synchronize() waits for its latest parameters
        self._latest["train_step"] = step
        return step

    def close(self) -> None:
        """Drop the workloads' arrays (their device memory is freed once their steps have run)."""
        self._latest.clear()

    def _keep(self, name: str, output: Any) -> None:
        self._latest[name] = output

    def __repr__(self) -> str:
        return f"JaxBench({self.name!r}, device={self._device})"
