"""What a part is built from, and the shape every part has."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .._options import Option

if TYPE_CHECKING:
    from ..backends import Backend
    from ..core.hosttime import HostTimes
    from ..core.rule import Core
    from ..stats import Stats
    from .timing import Sampling

P = TypeVar("P")


class Build:
    """The throttle as its parts see it while they are built, in the order of ``PARTS``.

    Attributes:
        core: the throttle's core (the throttle subscribes each part built to it).
        backend: the resolved device.
        options: every option of the throttle, already checked.
        clock: the throttle's host clock.
        host: the throttle's host times (``wall_s()``: seconds inside passes; ``fetch_s``,
            ``between_s``).
        sampling: which steps are sampled (``sampling.sampled(step)``; ``sample_every=``).
    """

    def __init__(self, core: Core, backend: Backend, options: Mapping[str, Any],
                 clock: Callable[[], float], host: HostTimes, sampling: Sampling) -> None:
        self.core, self.backend, self.options = core, backend, options
        self.clock, self.host, self.sampling = clock, host, sampling
        self.built: dict[type, Any] = {}

    def part(self, kind: type[P]) -> P | None:
        """The part of class ``kind`` built before this one, or None (it is off or comes later)."""
        return self.built.get(kind)


class Part:
    """A feature of the throttle, in a module of its own under ``asyncthrottle/parts/``; subclasses
    override.

    It declares its place among the parts (``PLACE``: ``parts/_declared.py`` lists the parts
    in that order, written by ``python -m asyncthrottle.parts._declare``). It owns its options:
    ``OPTIONS`` declares each once (an
    :class:`~asyncthrottle._options.Option`: name, type, default, check, docs
    line), the throttle checks every value with its declaration's check on
    every backend before anything is built, and :meth:`check` adds the
    constraints between them. It builds itself when they turn it on
    (:meth:`build`), supplies its fields of :class:`~asyncthrottle.Stats`
    (:meth:`fields`, declared by its ``STATS`` dataclass), its lines of the
    summary (:meth:`summary_lines`) and of the progress bar (:meth:`postfix`),
    and lets go of what it holds when the
    throttle is closed or dropped (:meth:`close`). The defaults: no options,
    no fields, no lines, nothing to let go of.

    Subscribing, one way: the throttle subscribes every part it built
    (``core.subscribe(part)``, in the order of ``PARTS``), so the part hears
    each notification of :class:`~asyncthrottle.Subscriber` whose method it
    defines -- the core's and the other parts' (``on_sample``,
    ``on_sections``, ``on_values``) alike; :meth:`build` never subscribes. A
    hook it needs only for a while (a sample waiting to be read) is a method
    under another name, added and removed with ``core.listen(name, hook)`` and
    ``core.unlisten``. A part that tells one of the parts' notifications
    tells the core's list (``core.on_sample``: :func:`~asyncthrottle.core.notify.tell`).
    """

    __slots__ = ()
    # its place among the parts: built, subscribed and summarised in the order of PLACE (a part
    # may use the parts placed before it: ``Build.part``); None: not a part of the throttle
    PLACE: ClassVar[int | None] = None
    OPTIONS: ClassVar[tuple[Option, ...]] = ()
    STATS: ClassVar[type | None] = None

    @staticmethod
    def check(options: Mapping[str, Any]) -> None:
        """Raise ``TypeError``/``ValueError`` where its options do not go together (each value has
        passed its own declaration's check: ``Option.check``); warn for a deprecated one."""

    @classmethod
    def build(cls, at: Build) -> Any:
        """The part for these options (the throttle subscribes it); None when the options leave it
        off."""
        raise NotImplementedError

    def fields(self) -> dict[str, Any]:
        """This part's fields of a :class:`~asyncthrottle.Stats` snapshot (never blocks or
        syncs)."""
        return {}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        """This part's lines of ``Stats.summary()`` (called whether or not the part was built)."""
        return []

    @staticmethod
    def postfix(stats: Stats) -> list[str]:
        """This part's ``name=value`` entries of the progress bar's postfix (``wrap(progress=)``;
        called whether or not the part was built, at tqdm's cadence: short, never blocking)."""
        return []

    def close(self) -> None:
        """The throttle is closed, or was dropped, or the interpreter exits: let go of what the part
        holds beyond host numbers (events, pinned buffers, a process group, a process-wide mode)
        and of any reference cycle of its own, so that dropping the throttle frees it without the
        cyclic garbage collector.

        Called once, after the core's last notification, on any thread (a finalizer's); never
        blocks. :meth:`fields` (and so ``stats``) must still read after it.
        """
