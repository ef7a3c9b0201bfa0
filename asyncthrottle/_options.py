"""Option checks, one rule for all: a wrong type raises ``TypeError``, a wrong value ``ValueError``.

Every message names the option, the value and a fix. Every check runs on every
backend, the CPU included, before anything is built: a value the CPU accepts
never fails only on a GPU. Parts call these helpers from their own ``check``;
the helpers live in ``core/checks.py`` (the core's wait strategies use them,
and the core imports nothing outside ``core/``). :class:`AutoDepth`, a value of
``depth=``, is here beside its check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .core.checks import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_positive,
    check_real,
    wrong_type,
)

__all__ = [
    "DEFAULT_MAX_DEPTH", "AutoDepth", "check_bool", "check_callable", "check_choice", "check_core",
    "check_depth", "check_int", "check_positive", "check_real", "check_streams",
]

# an AutoDepth never goes deeper unless told
DEFAULT_MAX_DEPTH = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoDepth:
    """``depth=AutoDepth(max=8)``: let the throttle find the depth a loop needs, up to ``max``.

    It starts at 2 (or ``max``, if lower) and goes one deeper whenever the
    device keeps running dry in the loop body while the host also waits on it;
    never shallower (docs/auto-depth.md). ``depth="auto"`` is ``AutoDepth()``.

    Example:
        >>> import asyncthrottle as at
        >>> at.Throttle(at.AutoDepth(max=4), device="cpu").depth
        2

    Args:
        max: the deepest it may go, an int >= 1 (a wrong type raises ``TypeError``, a wrong value
            ``ValueError``).
    """

    max: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        check_int("AutoDepth max", self.max, minimum=1, none=False,
                  rule="an int >= 1 (the deepest the depth may go)", fix="e.g. AutoDepth(max=16)")


# -- the options of the core (the parts check their own) ----------------------

_DEPTHS = "an int >= 1, 'auto', an AutoDepth or None"


def check_depth(depth: object) -> int | str | AutoDepth | None:
    """``depth``: an int >= 1, None (track only), ``"auto"`` or an :class:`AutoDepth`."""
    if isinstance(depth, AutoDepth):
        return depth
    if isinstance(depth, str):
        if depth == "auto":
            return depth
        if depth.strip().lower() == "auto":
            raise ValueError(f"depth={depth!r}: write it depth='auto' (lower case, no spaces)")
        raise ValueError(f"depth must be {_DEPTHS}, got {depth!r} (str); e.g. depth=2")
    checked = check_int("depth", depth, minimum=1, rule=_DEPTHS,
                        fix="depth=1 syncs once per step, depth=2 is the usual choice")
    return checked


def check_streams(streams: object) -> None:
    """``streams``: None, or a non-empty list of streams: objects with ``wait_stream`` and
    ``wait_event``, as ``torch.Stream`` and its device kinds (``torch.cuda.Stream``) have; the
    events are recorded on them, and ``to=``'s copies are ordered before them with those two.

    Checked before the device is resolved, so every backend refuses the same values (whether a
    device has streams at all is its backend's to say: the CPU, MPS and JAX have none).
    """
    if streams is None:
        return
    rule = "None or a non-empty list of streams"
    fix = "pass e.g. streams=[torch.cuda.current_stream(), side]"
    if isinstance(streams, (str, bytes)) or not isinstance(streams, Sequence):
        raise wrong_type("streams", streams, rule, fix)
    if not streams:
        raise ValueError(f"streams must be {rule}, got {streams!r}; drop streams= to record on the "
                         "current stream")
    for index, stream in enumerate(streams):
        if not (callable(getattr(stream, "wait_stream", None))
                and callable(getattr(stream, "wait_event", None))):
            raise TypeError(f"streams must be {rule}, got {stream!r} ({type(stream).__name__}) at "
                            f"streams[{index}]: a stream is a torch.Stream such as "
                            f"torch.cuda.Stream(); {fix}")


def check_core(options: Mapping[str, Any]) -> float | None:
    """The core's options: depth, timeout, drain, clock and streams (wait, device, events: their
    resolvers).

    Returns the timeout in seconds (None: wait for ever).
    """
    check_depth(options["depth"])
    timeout = check_positive("timeout", options["timeout"], rule="a number of seconds > 0 or None",
                             fix="pass e.g. timeout=60.0, or None to wait for ever",
                             infinite="none")
    check_bool("drain", options["drain"])
    if not callable(options["clock"]):
        raise wrong_type("clock", options["clock"], "a zero-argument callable returning seconds",
                          "pass e.g. clock=time.perf_counter")
    check_streams(options["streams"])
    return timeout
