"""The library's exception (a wait that ran past its timeout), and the messages of a call made too
early or too late."""

from __future__ import annotations

from typing import Any


class ThrottleTimeout(TimeoutError):
    """A wait for a step ran longer than the throttle's ``timeout``.

    Nothing is lost: the step is still tracked; in a wrapped loop the next
    ``next()`` waits again and hands out the batch it had already fetched,
    and ``drain()`` or ``begin_step()`` wait again when called again.

    Attributes:
        step: the step the host was waiting for.
        depth: the throttle's depth.
        waited_s: seconds the host waited before giving up.
        timeout: the timeout in force, in seconds.
    """

    def __init__(self, step: int, depth: int | None, waited_s: float, timeout: float) -> None:
        self.step = step
        self.depth = depth
        self.waited_s = waited_s
        self.timeout = timeout
        super().__init__(
            f"step {step} did not complete on the device within timeout={timeout:g} s "
            f"(waited {waited_s:.3f} s, depth={depth}); the device may be hung or the step "
            "slower than expected: raise timeout=, or call drain() to keep waiting"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled and copied by its own arguments (a worker's error crosses a process pool)
        return type(self), (self.step, self.depth, self.waited_s, self.timeout), self.__dict__


def not_ended(step: int) -> str:
    """The message for a read of step ``step``'s values before the step was recorded."""
    return (
        f"step {step} has not ended yet (its event is recorded when the loop moves on): read "
        "deferred values after their step, e.g. in on_complete, thr.latest, or a later step"
    )


def closed(what: str) -> str:
    """The message for ``what`` (a call that would change the throttle) on a closed throttle."""
    return (
        f"{what} on a closed Throttle: close() (or the end of its `with` block) waited for its "
        "steps and released its events; make a new Throttle for another loop (a closed one keeps "
        "its stats, latest and export_trace() readable)"
    )
