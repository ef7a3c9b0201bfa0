"""``nonfinite=``: a NaN or Inf in a deferred value, seen on the host copy when its step completes,
without a sync.

Every deferred value reaches the host anyway once its step is complete (see
:mod:`asyncthrottle.values`); this part looks at each floating-point leaf of
it there. It never touches a device tensor: what it reads are the host copies
the step's event already covers.
"""

from __future__ import annotations

import cmath
import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping
from itertools import chain
from typing import TYPE_CHECKING, Any

from .._callers import warn_at_user
from .._options import Option, check_choice
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build

_CHOICES = ("warn", "raise", None)


class NonFiniteWarning(RuntimeWarning):
    """A deferred value held a NaN or an Inf (``Throttle(nonfinite="warn")``, the default); given
    once per throttle."""


class NonFiniteError(FloatingPointError):
    """A deferred value held a NaN or an Inf (``Throttle(nonfinite="raise")``).

    Raised from the throttle call that delivered the value (the next
    ``next()``, ``begin_step()``, ``end_step()``, ``drain()`` or
    ``Deferred.get()``), after every part and ``on_complete`` callback heard
    the step: the throttle stays usable, so the loop may save a checkpoint,
    skip an update or go on.

    Attributes:
        step: the step that produced the value.
        name: its name in ``Throttle.latest``, with where inside it the bad
            leaf is (``"loss"``, ``"metrics['grad_norm']"``, ``"loss[1]"``).
        value: that leaf, as delivered on the host (a float, a CPU tensor or a
            numpy array).
        seen: the step the host was at when it saw it: on an asynchronous
            device the step being handed out (``seen - step`` steps later,
            once step ``seen - 1`` was recorded); on a synchronous one (the
            CPU) ``step`` itself, seen at that step's end.
    """

    def __init__(self, step: int, name: str, value: Any, seen: int) -> None:
        self.step, self.name, self.value, self.seen = step, name, value, seen
        super().__init__(describe(step, name, value, seen))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.step, self.name, self.value, self.seen)


def describe(step: int, name: str, value: Any, seen: int) -> str:
    """The text of the warning and the error: the step, the name, the value and how late it was
    seen."""
    when = ("in the same step (at its end: a synchronous backend)" if seen <= step else
            f"{seen - step} step(s) later (once step {seen - 1} was recorded)")
    return (f"asyncthrottle: the deferred value {name!r} of step {step} is {_shown(value)}; "
            f"seen on the host {when}, without a sync")


@dataclasses.dataclass(frozen=True)
class NonFiniteStats:
    """The fields of :class:`~asyncthrottle.Stats` that the non-finite watch supplies."""

    nonfinite: int = 0
    nonfinite_first: int | None = None


class NonFiniteWatch(Part):
    """A part of the throttle: looks for NaN and Inf in each step's deferred values, on the host, as
    they arrive.

    It hears every step's values as the throttle's
    :class:`~asyncthrottle.values.Completions` delivers them
    (``Subscriber.on_values``, before the ``on_complete`` callbacks) and walks
    their mappings, lists, tuples and dataclasses.
    Floating-point and complex leaves are looked at (Python floats, numpy
    scalars and arrays, CPU torch tensors; JAX arrays arrive as numpy
    arrays, bfloat16 and float8 ones as ml_dtypes arrays); integers,
    booleans and anything else are ignored, and so is a tensor that is not
    on the CPU (a value never arrives so; a device is never asked). A step
    counts once, at its first bad leaf; it is warned about once per
    throttle, at the user's line.

    Args:
        core: the throttle's core (read only: how many steps have started).
        mode: ``"warn"`` or ``"raise"``.
    """

    OPTIONS = (
        Option("nonfinite", "str | None", "warn",
               "look for NaN/Inf in the deferred values as their step completes: `\"warn\"` once, "
               "`\"raise\"`, or `None` (off)",
               "[Deferred values](deferred.md#nan-and-inf-nonfinite)",
               functools.partial(check_choice, choices=_CHOICES,
                                 fix="pass nonfinite='warn' (the default), 'raise' to stop the "
                                     "loop, or None to look at nothing"),
               wrong_type=(1, True), wrong_value=("loud",),
               help=('``"warn"`` (default), ``"raise"`` or None: look for NaN/Inf in every '
                     "deferred value's host copy as its step completes; warn once "
                     "(:class:`~asyncthrottle.NonFiniteWarning`) or raise "
                     ":class:`~asyncthrottle.NonFiniteError` from the call that delivered it. No "
                     "sync.")),
    )
    STATS = NonFiniteStats
    __slots__ = ("core", "first", "mode", "number", "steps", "warned")
    PLACE = 120

    @classmethod
    def build(cls, at: Build) -> NonFiniteWatch | None:
        mode = at.options["nonfinite"]
        return None if mode is None else cls(at.core, mode)

    def __init__(self, core: Core, mode: str) -> None:
        self.core, self.mode = core, mode
        self.steps = 0
        self.first: int | None = None
        self.warned = False
        # a framework callback's numbering of the steps (hooks.ThrottleHooks), for the report
        self.number: Callable[[int], int] | None = None

    def fields(self) -> dict[str, Any]:
        return {"nonfinite": self.steps, "nonfinite_first": self.first}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        if not stats.nonfinite:
            return []
        return [f"  nonfinite: {stats.nonfinite} steps had a NaN or Inf deferred value, the first "
                f"step {stats.nonfinite_first} (see docs/deferred.md)"]

    def on_values(self, step: int, values: dict[str, Any]) -> None:
        """The step's values on the host: count, then warn or raise at a bad leaf. Never blocks."""
        # torch.Tensor, or None before torch is imported (no call: the per-step path)
        torch = sys.modules.get("torch")
        tensor = None if torch is None else torch.Tensor
        for name, value in values.items():
            if type(value) is tensor:
                # the usual torch value, a loss or a small tensor on the host: _find without the
                # walk
                if not _tensor_bad(value):
                    continue
                found: tuple[str, Any] | None = (name, value)
                break
            if type(value) in _SCALARS:
                # the usual value, a loss (a numpy scalar array from JAX): _find without the walk,
                # and _scalar_bad inlined (the per-step path)
                try:
                    number = value.item()
                    if number - number == 0:
                        continue
                except Exception:
                    pass
            found = _find(value, name)
            if found is not None:
                break
        else:
            return
        assert found is not None  # (for mypy: the loop breaks at one)
        # a synchronous backend delivers a step's values at its own end
        late = 0 if self.core.synchronous else self.core.steps - step
        if self.number is not None:
            step = self.number(step)
        seen = step + late
        self.steps += 1
        if self.first is None:
            self.first = step
        where, leaf = found
        if self.mode == "raise":
            raise NonFiniteError(step, where, leaf, seen)
        if not self.warned:
            self.warned = True
            self.warn(describe(step, where, leaf, seen) + "; later ones are counted in "
                      "stats.nonfinite")

    def warn(self, message: str) -> None:
        """Warn at the user's line (outside asyncthrottle and the framework calling it); the
        caller warns once a throttle."""
        warn_at_user(message, NonFiniteWarning)


# a CPU tensor of at most this many elements is read with tolist() and walked in Python
_WALKED = 128
# numpy's array and scalar types of floats (or complexes) seen by _host_array_bad
_SCALARS: set[type] = set()


def _scalar_bad(value: Any) -> bool:
    """Whether ``value``, of a type in ``_SCALARS``, may be bad: False when it is one finite number.

    Its item is a number whatever the dtype (an int or a bool is never bad); an array of more than
    one element, or one whose item is no number, raises: True, so that :func:`_find` walks it.
    """
    try:
        number = value.item()
        return bool(number - number != 0)
    except Exception:
        return True


def _find(value: Any, where: str) -> tuple[str, Any] | None:
    """The first leaf of ``value`` that is a NaN or an Inf, with its place, or None."""
    # numpy's float64 too
    if isinstance(value, float):
        # inf - inf and nan - nan are nan
        return None if value - value == 0.0 else (where, value)
    numpy = sys.modules.get("numpy")
    # The usual leaf (a JAX loss arrives as a numpy array), asked before the slower ABC checks
    # below.
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        return (where, value) if _host_array_bad(value) else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return (where, value) if _tensor_bad(value) else None
    # bool is an int
    if isinstance(value, (int, str, bytes)) or value is None:
        return None
    if isinstance(value, complex):
        return None if cmath.isfinite(value) else (where, value)
    if isinstance(value, (dict, Mapping)):
        tensor = None if torch is None else torch.Tensor
        for key, item in value.items():
            # the usual items, metrics (numpy scalar arrays from JAX, small torch tensors): no walk,
            # and no place named for a clean one
            kind = type(item)
            if kind in _SCALARS:
                if not _scalar_bad(item):
                    continue
            elif kind is tensor and not _tensor_bad(item):
                continue
            found = _find(item, f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _find(item, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            found = _find(getattr(value, field.name, None), f"{where}.{field.name}")
            if found is not None:
                return found
        return None
    return (where, value) if _numpy_bad(value) else None


def _tensor_bad(tensor: Any) -> bool:
    """A CPU tensor that holds a NaN or an Inf; a tensor elsewhere is never asked (a delivered one
    is on the host)."""
    try:
        if not tensor.is_cpu:
            return False
        size = tensor.numel()
        if size <= _WALKED:
            # A small tensor's numbers, read in one call and walked in Python: inside a loop that
            # defers a tensor every step, torch's or numpy's isfinite cost ~25 us a step even on
            # two floats (5-10 us when timed alone), and every torch call ~1-3 (a reshape to 1-d
            # too), this one tolist(). Any dtype reads so (bfloat16, complex); an int or a bool is
            # finite: its difference with itself is 0.
            numbers = tensor.tolist()
            if type(numbers) is not list:
                # a 0-d tensor: one number
                return bool(numbers - numbers != 0)
            while numbers and type(numbers[0]) is list:
                # rows: one level flatter (chain runs in C; a comprehension is a call in 3.11)
                numbers = list(chain.from_iterable(numbers))
            for number in numbers:
                if number - number != 0:
                    return True
            return False
        if not (tensor.is_floating_point() or tensor.is_complex()):
            return False
        try:
            # a view, no copy
            array = tensor.numpy()
        except (TypeError, RuntimeError):
            # a dtype numpy lacks (bfloat16), a conjugate or negative view: torch's own check
            return not bool(sys.modules["torch"].isfinite(tensor).all())
        return _host_array_bad(array)
    except RuntimeError:
        # a layout that does not read this way (sparse, quantized): never a loop's end
        return False


def _numpy_bad(value: Any) -> bool:
    """A numpy (or completed JAX) array or scalar of floats that holds a NaN or an Inf."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return False
    # a JAX array; delivered values are complete: this does not wait
    if hasattr(value, "copy_to_host_async"):
        value = numpy.asarray(value)
    if not isinstance(value, (numpy.ndarray, numpy.generic)):
        return False
    return _host_array_bad(value)


def _host_array_bad(value: Any) -> bool:
    """A numpy array or scalar of floats that holds a NaN or an Inf."""
    kind = value.dtype.kind
    if kind not in "fc" and not (kind == "V" and _extended_float(value.dtype)):
        return False
    if len(_SCALARS) < 16:
        _SCALARS.add(type(value))
    size = value.size
    if size == 1:
        # a Python float or complex: no numpy warning for inf - inf
        number = value.item()
        return bool(number - number != 0)
    return size > 0 and not bool(sys.modules["numpy"].isfinite(value).all())


@functools.cache
def _extended_float(dtype: Any) -> bool:
    """An ml_dtypes floating type (bfloat16, float8_e4m3fn, ...: numpy's kind ``'V'``, JAX's
    bfloat16 and float8 host copies); ``isfinite`` and ``item()`` read them like numpy's floats."""
    ml_dtypes = sys.modules.get("ml_dtypes")
    if ml_dtypes is None:
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        # an integer type (int4), a structured dtype, raw bytes
        return False
    return True


def _shown(value: Any) -> str:
    """The bad value for a message: the number itself, or what an array holds."""
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return str(value.item())
        bad = int((~torch.isfinite(value)).sum())
        return (
            f"a tensor of shape {tuple(value.shape)} with {bad} NaN/Inf of {value.numel()} elements"
        )
    if numpy is not None and hasattr(value, "copy_to_host_async"):
        value = numpy.asarray(value)
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        if value.size == 1:
            return str(value.item())
        bad = int((~numpy.isfinite(value)).sum())
        return f"an array of shape {value.shape} with {bad} NaN/Inf of {value.size} elements"
    return repr(value)
