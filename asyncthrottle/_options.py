"""The options' one declaration (:class:`Option`), the core's options, and the one rule of their
checks: a wrong type raises ``TypeError``, a wrong value ``ValueError``.

Every keyword of :class:`~asyncthrottle.Throttle` is declared once, by what owns it: a part in its
``OPTIONS``, the core here (:data:`CORE_OPTIONS`). The Throttle checks each value with its
declaration's check, on every backend, before anything is built (a value the CPU accepts never
fails only on a GPU); the signature, its docstring, the options table of docs/depth-rule.md and the
bad-value tests are held to the declarations by tests/test_options.py. Every message names the
option, the value and a fix; the helpers live in ``core/checks.py`` (the core's wait strategies
use them, and the core imports nothing outside ``core/``). :class:`AutoDepth`, a value of
``depth=``, is here beside its check.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

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
    "CORE_OPTIONS", "DEFAULT_MAX_DEPTH", "AutoDepth", "Option", "check_at", "check_bool",
    "check_callable", "check_choice", "check_depth", "check_int", "check_positive", "check_real",
    "check_streams", "named_arguments", "unexpected_arguments",
]

P = ParamSpec("P")


@dataclasses.dataclass(frozen=True)
class Option:
    """One keyword of :class:`~asyncthrottle.Throttle`, declared once, by what owns it (a part's
    ``OPTIONS``, or :data:`CORE_OPTIONS`).

    Attributes:
        name: the keyword.
        type: its annotation, as ``Throttle.__init__`` writes it (``"int | None"``).
        default: its default value.
        doc: what it does, in one line: the "what" of the options table (markdown).
        more: where the docs say more: the table's last column (markdown).
        check: ``check(name, value)``: the checked value, or ``TypeError`` for a wrong type and
            ``ValueError`` for a wrong value, naming the option, the value and a fix. None: its
            resolver checks it (``device=``, ``events=``, ``wait=``), as early. A constraint
            between options is its owner's (``Part.check``).
        wrong_type: values refused with a ``TypeError`` (the bad-value tests try each).
        wrong_value: values refused with a ``ValueError``.
        shown: the default as the table shows it (markdown; None: the value, quoted).
        deprecated: what replaces it, for the table's row of deprecated options (None: current).
        help: its entry in the ``Args`` of ``Throttle.__init__``'s docstring (what ``help()`` and
            an IDE show; reStructuredText, one paragraph: ``parts/_declared.py`` wraps it).
    """

    name: str
    type: str
    default: Any
    doc: str
    more: str
    check: Callable[[str, Any], Any] | None = None
    wrong_type: tuple[Any, ...] = ()
    wrong_value: tuple[Any, ...] = ()
    shown: str | None = None
    deprecated: str | None = None
    help: str = ""

    def checked(self, value: Any) -> Any:
        """``value`` checked (see :attr:`check`)."""
        return value if self.check is None else self.check(self.name, value)

    def row(self) -> str:
        """Its row of the options table of docs/depth-rule.md."""
        default = self.default
        shown = self.shown or (f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`")
        return f"| `{self.name}=` | {shown} | {self.doc} | {self.more} |"


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


def check_streams(name: str, streams: object) -> Any:
    """``streams``: None, or a non-empty list of streams: objects with ``wait_stream`` and
    ``wait_event``, as ``torch.Stream`` and its device kinds (``torch.cuda.Stream``) have; the
    events are recorded on them, and ``to=``'s copies are ordered before them with those two.

    Checked before the device is resolved, so every backend refuses the same values (whether a
    device has streams at all is its backend's to say: the CPU, MPS and JAX have none).
    """
    if streams is None:
        return None
    rule = "None or a non-empty list of streams"
    fix = "pass e.g. streams=[torch.cuda.current_stream(), side]"
    if isinstance(streams, (str, bytes)) or not isinstance(streams, Sequence):
        raise wrong_type(name, streams, rule, fix)
    if not streams:
        raise ValueError(f"{name} must be {rule}, got {streams!r}; drop streams= to record on the "
                         "current stream")
    for index, stream in enumerate(streams):
        if not (callable(getattr(stream, "wait_stream", None))
                and callable(getattr(stream, "wait_event", None))):
            raise TypeError(f"{name} must be {rule}, got {stream!r} ({type(stream).__name__}) at "
                            f"streams[{index}]: a stream is a torch.Stream such as "
                            f"torch.cuda.Stream(); {fix}")
    return streams


def check_at(at: object, now: float) -> float:
    """``pause(at=)``: a time of the throttle's clock no later than ``now`` (its clock's now)."""
    return check_real("at", at, low=-math.inf, high=now,
                      rule=f"a time of the throttle's clock no later than now ({now!r})",
                      fix="pass a time from the throttle's clock (clock=, time.perf_counter by "
                          "default), e.g. time.perf_counter() but not time.time(), or None for now")


def _check_clock(name: str, clock: object) -> Any:
    if not callable(clock):
        raise wrong_type(name, clock, "a zero-argument callable returning seconds",
                         "pass e.g. clock=time.perf_counter")
    return clock


class _Stream:
    """A stand-in stream (``wait_stream`` and ``wait_event``), for ``streams=``'s bad examples."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


# the backend's, the waits' and the rule's own options (the parts declare theirs)
CORE_OPTIONS = (
    Option("depth", "int | str | AutoDepth | None", 2,
           "steps allowed in flight: an int >= 1, `None` (only track), `\"auto\"` or "
           "`at.AutoDepth(max=8)`", "the rule above, [`depth=\"auto\"`](auto-depth.md)",
           lambda name, depth: check_depth(depth), wrong_type=(2.5, AutoDepth),
           wrong_value=("deep", 0),
           help=('steps allowed in flight: an int >= 1, None (track only), ``"auto"`` (start at 2,'
                 " go one deeper whenever the device keeps running dry in the loop body while the "
                 "host also waits; never shallower; docs/auto-depth.md) or "
                 ':class:`~asyncthrottle.AutoDepth` (``"auto"`` with its cap: '
                 '``AutoDepth(max=16)``; ``"auto"`` is ``AutoDepth()``, at most 8).')),
    Option("device", "Any", None, "which device's events", "below", shown="`None` (auto)",
           help=('None auto-detects (an available accelerator, else the CPU); ``"cuda"``, '
                 '``"cuda:1"``, a ``torch.device``, ``"mps"``, ``"xpu"``, ``"jax"``, ``"cpu"``, or'
                 " any device ``torch.Event`` supports. An explicit device that is not available "
                 "raises ``RuntimeError``.")),
    Option("events", "EventFactory | None", None, "your own event factory instead of `device`",
           "below, [architecture](architecture.md#plugging-in-a-backend)",
           help=("instead of ``device``, a zero-argument factory of objects with ``record()``, "
                 "``query()``, ``synchronize()`` and optionally ``elapsed_time(end)`` (device "
                 "timing turns itself off at the first failure of it).")),
    Option("wait", "str | WaitStrategy", "auto",
           "how the host waits: `\"hybrid\"`, or `\"spin-block\"` on JAX's CPU backend",
           "[Waits](waits.md)", wrong_value=("sometimes",),
           help=('``"auto"`` (default: ``"spin-block"`` on JAX\'s CPU backend without a '
                 '``timeout``, where the device is the host\'s own cores; ``"hybrid"`` elsewhere), '
                 '``"hybrid"`` (sleep until shortly before the predicted completion, then spin), '
                 '``"spin-block"`` (spin while waits are short, else sleep in the runtime\'s wait),'
                 ' ``"poll"``, ``"spin"``, ``"block"`` or a :class:`~asyncthrottle.WaitStrategy` '
                 "(docs/waits.md).")),
    Option("timeout", "float | None", None, "seconds one wait may take, then `at.ThrottleTimeout`",
           "below", functools.partial(check_positive, rule="a number of seconds > 0 or None",
                                      fix="pass e.g. timeout=60.0, or None to wait for ever",
                                      infinite="none"),
           wrong_type=("5",), wrong_value=(0,),
           help=("seconds one wait may take before ``ThrottleTimeout`` (None: for ever); needs "
                 '``"auto"``, ``"hybrid"``, ``"poll"`` or ``"spin"``.')),
    Option("drain", "bool", True, "wait for every step at the end of a wrapped pass",
           "the rule above", check_bool, wrong_type=("yes",),
           help="wait for every step at the end of a wrapped iteration."),
    Option("streams", "Any", None, "one event per stream, for work on side streams", "below",
           check_streams, wrong_type=(5, "side", [1, 2], (_Stream(), "side")), wrong_value=([],),
           help="record on these streams (one event each) instead of the current stream."),
    Option("clock", "Callable[[], float]", time.perf_counter,
           "the host clock (tests inject a fake one)", "[Testing](testing.md)", _check_clock,
           wrong_type=(3,), shown="`time.perf_counter`",
           help="the clock that times the host (tests inject a fake one)."),
)


# -- the arguments themselves: a misspelt keyword is named with the closest one --------------


def named_arguments(init: Callable[P, None]) -> Callable[P, None]:
    """``Keywords.__init__`` (written from the declarations), refusing an argument it does not take
    with :func:`unexpected_arguments`: Python's own error would name ``Keywords.__init__``, which
    the user never called, and no keyword near the one misspelt. Its signature, for ``help()`` and
    an IDE, is ``init``'s."""
    parameters = list(inspect.signature(init).parameters.values())[1:]
    names = tuple(parameter.name for parameter in parameters)
    positional = sum(1 for parameter in parameters
                     if parameter.kind is parameter.POSITIONAL_OR_KEYWORD)

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        given = args[1:]
        if len(given) > positional or not set(kwargs).issubset(names) or (
                set(names[:len(given)]) & set(kwargs)):
            raise unexpected_arguments(type(args[0]).__name__, given, kwargs, names, positional)
        init(*args, **kwargs)

    return checked


def unexpected_arguments(owner: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                         names: Sequence[str], positional: int = 1) -> TypeError:
    """The error of ``owner(*args, **kwargs)`` where ``owner`` takes the keywords ``names``, the
    first ``positional`` of them by position too: it names ``owner``, each keyword it does not
    take with the closest one it does (``did you mean depth?``), and what to pass by keyword."""
    unknown = [name for name in kwargs if name not in names]
    if unknown:
        said = []
        for name in unknown:
            near = difflib.get_close_matches(name, names, n=1)
            said.append(f"{name!r} (did you mean {near[0]}?)" if near else repr(name))
        kind = "unexpected keyword arguments" if len(said) > 1 else "an unexpected keyword argument"
        return TypeError(f"{owner}() got {kind} "
                         f"{', '.join(said)}; its keywords are {', '.join(names)} "
                         f"(help({owner}) says what each does)")
    twice = [name for name in names[:len(args)] if name in kwargs]
    if twice:
        return TypeError(f"{owner}() got {twice[0]} twice, by position and as {twice[0]}=; pass "
                         "it once")
    shown = ", ".join(repr(arg) for arg in args)
    taken = f"{positional} positional argument{'s' if positional > 1 else ''}"
    return TypeError(f"{owner}() takes {taken} ({', '.join(names[:positional])}) but {len(args)} "
                     f"were given ({shown}); pass the others by keyword: "
                     f"{', '.join(f'{name}=' for name in names[positional:])}")
