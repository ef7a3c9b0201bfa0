"""A jitted JAX loop that reads its loss on the host every step (float(loss): a sync on an
accelerator): run hears PyTorch only, and says so instead of "no host reads"."""

import jax
import jax.numpy as jnp


def loss_of(w, x):
    return jnp.mean((x @ w - 1.0) ** 2)


@jax.jit
def step(w, x):
    loss, grad = jax.value_and_grad(loss_of)(w, x)
    return w - 0.1 * grad, loss


w, x = jnp.zeros(3), jnp.ones((4, 3)) / 2
for k in range(4):
    w, loss = step(w, x)
    print(f"step {k} loss {float(loss):.4f}")
