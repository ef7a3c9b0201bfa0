"""JAX: events for a JAX device (``device="jax"``) and ``barrier_on()`` for work on other devices.

The implementation lives in :mod:`asyncthrottle.backends.jax`; this is its public path.
"""

from .backends.jax import JaxEvent, TimedJaxEvent, barrier_on, jax_events

__all__ = ["JaxEvent", "TimedJaxEvent", "barrier_on", "jax_events"]
