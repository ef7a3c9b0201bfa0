"""Where a tensor would live on an accelerator: the device (a module's parameters and buffers, what
is moved there or made there, what is computed from them) or the host (what is built from Python
or NumPy data, and what is computed only from that). Off CUDA a read counts only of the first."""

from __future__ import annotations

import linecache
import re
import sys
import weakref
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..backends import names_the_host
from .callerwarnings import CallerWarnings
from .sources import Found, Sources

if TYPE_CHECKING:
    from .frames import Frames
    from .patches import Patches

__all__ = ["BUILDERS", "Homes"]

# torch's functions that make a tensor: on the host, unless given device=
BUILDERS = ("tensor", "as_tensor", "asarray", "from_numpy", "empty", "zeros", "ones", "full",
            "rand", "randn", "randint", "randperm", "arange", "linspace", "logspace", "eye")
# the builders whose tensor, made from a tensor, is where that one is (as_tensor(t) is t)
_FOLLOW = frozenset(("tensor", "as_tensor", "asarray"))
# how many items of a list, tuple or dict a source value is judged by
_PEEK = 8
# a line that builds on the CPU by name
_CPU = re.compile(r"""device\s*=\s*(torch\.device\()?["']cpu["']""")
# how many values of a saved object are looked at
_SAVED = 1000
# how many of torch's frames outwards a read inside torch is judged by (then the caller's)
_TORCH_FRAMES = 8


class Homes:
    """Marks tensors as they are made, by their storage (views, ``detach()`` and in-place ops
    keep it): on the device (a module's buffer as it is registered, a tensor ``to()`` a device,
    one made with ``device=``), or on the host (built by a :data:`BUILDERS` function without
    ``device=``). :meth:`on_device` judges a read's tensor: autograd's history, a
    ``Parameter`` or its mark decide; a tensor computed since (no history, no mark) is judged
    by the values its line computes from (:class:`~asyncthrottle.audit.sources.Sources`)."""

    def __init__(self, frames: Frames) -> None:
        self._frames = frames
        self._sources = Sources()
        # each marked storage's data pointer: the tensor marked (weakly) and whether on the device
        self._marks: dict[int, tuple[weakref.ref[Any], bool]] = {}
        self._parameter: Any = type(None)
        self._tensor: Any = type(None)
        self._module: Any = type(None)
        self._ndarray: Any = type(None)
        # what to() takes as a device (its first argument's type)
        self._devices: frozenset[type] = frozenset()
        # which lines name the CPU as a literal device, by code and line
        self._cpu_lines: dict[tuple[Any, int], bool] = {}
        self._front: Callable[[], None] = _nothing

    def install(self, patches: Patches) -> None:
        """Hook torch's tensor makers and module buffer registration (undone by ``patches``)."""
        import torch

        self._parameter, self._tensor, self._module = (
            torch.nn.Parameter, torch.Tensor, torch.nn.Module)
        self._devices = frozenset((str, int, torch.device))
        try:
            import numpy
        except ImportError:
            pass
        else:
            self._ndarray = numpy.ndarray
        compiling = torch.compiler.is_compiling
        # the wrappers' frames stand between the script and torch: their warnings (torch.tensor
        # of a tensor) are the script's line's
        warned = CallerWarnings(__name__)
        warned.start(patches)
        self._front = warned.front
        for name in BUILDERS:
            if hasattr(torch, name):
                patches.replace(torch, name, lambda original: _builder(self, original, compiling))
        module = torch.nn.modules.module
        patches.handle(module.register_module_buffer_registration_hook(self._registered))
        patches.handle(module.register_module_parameter_registration_hook(self._registered))

    def _registered(self, module: Any, name: str, tensor: Any) -> None:
        """A module's buffer or parameter: on the device (its ``state_dict()``'s detached
        copies share the mark)."""
        if isinstance(tensor, self._tensor):
            self.mark(tensor, True)

    def saved(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """The tensor ``torch.save(obj, ...)`` would read from the device: the first of ``obj``'s
        (in its dicts, lists and tuples, a module's parameters) on the device, else one of no
        known home (judged at the read); None when all it holds are on the host."""
        unknown, todo, seen = None, [obj], 0
        while todo and seen < _SAVED:
            value = todo.pop()
            seen += 1
            if isinstance(value, dict):
                todo.extend(value.values())
            elif isinstance(value, (list, tuple)):
                todo.extend(value)
            elif isinstance(value, self._module):
                todo.extend(value.parameters())
                todo.extend(value.buffers())
            elif isinstance(value, self._tensor):
                home = self._home(value)
                if home:
                    return value
                if home is None:
                    unknown = unknown if unknown is not None else value
        return unknown

    def mark(self, tensor: Any, device: bool) -> None:
        """``tensor``'s storage is on the device (``device``) or the host, from now on."""
        pointer = _pointer(tensor)
        if not pointer:
            return
        marks = self._marks

        def forget(ref: weakref.ref[Any]) -> None:
            if marks.get(pointer, (None,))[0] is ref:
                del marks[pointer]

        marks[pointer] = (weakref.ref(tensor, forget), device)

    def copied(self, out: Any, source: Any) -> bool:
        """When ``source`` is a tensor, ``out`` (made from it) is where it is: True (then
        marked, unless its home is unknown); False: ``source`` is no tensor."""
        if not isinstance(source, self._tensor):
            return False
        home = self._home(source)
        if home is not None:
            self.mark(out, home)
        return True

    def moved(self, bound: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A host tensor's ``to()`` (``bound``): what it returns is on the device when a device
        is named (``x.to(device)``; not ``x.to(torch.float16)``)."""
        self._front()
        out = bound(*args, **kwargs)
        # to(device, ...) names it first (to(dtype), to(other) do not), or as device=
        if (args and type(args[0]) in self._devices) or kwargs.get("device") is not None:
            self.mark(out, True)
        return out

    def front(self) -> None:
        """The wrappers' warning filter first again (see :class:`CallerWarnings`)."""
        self._front()

    def writes_cpu(self, frame: FrameType) -> bool:
        """Whether the frame's line names the CPU as a literal device (``device="cpu"``)."""
        key = (frame.f_code, frame.f_lineno)
        known = self._cpu_lines.get(key)
        if known is None:
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            known = self._cpu_lines[key] = _CPU.search(line) is not None
        return known

    def marked(self, tensor: Any) -> bool | None:
        """Whether ``tensor``'s storage is marked on the device (True), the host (False), or
        not at all (None)."""
        pointer = _pointer(tensor)
        mark = self._marks.get(pointer) if pointer else None
        if mark is None:
            return None
        held = mark[0]()
        return mark[1] if held is not None and _pointer(held) == pointer else None

    # -- judging a read -----------------------------------------------------------------------

    def on_device(self, tensor: Any, frame: FrameType) -> bool:
        """Whether the read by ``frame`` of ``tensor`` would read the device on an
        accelerator."""
        home = self._home(tensor)
        if home is not None:
            return home
        inside_torch = self._frames.torch_or_stdlib(frame)
        host = False
        for at in self._judged(frame):
            home = self._line(at, inside_torch=self._frames.torch_or_stdlib(at))
            if home:
                return True
            host = host or home is False
        # nothing says: the script's (or a package's) read of a tensor would sync; torch's own
        # read is of torch's bookkeeping (an optimizer's step counter made before the audit)
        return not host and not inside_torch

    def _judged(self, frame: FrameType) -> list[FrameType]:
        """The frame of the read; for a read in torch, torch's frames outwards and the first
        frame outside torch (the line that called it)."""
        frames: list[FrameType] = [frame]
        at: FrameType | None = frame
        while at is not None and self._frames.torch_or_stdlib(at) and len(frames) <= (
                _TORCH_FRAMES):
            at = at.f_back
            if at is not None:
                frames.append(at)
        return frames

    def _home(self, value: Any) -> bool | None:
        """Where ``value`` says it is: True (a tensor on the device, a module holding one),
        False (a host tensor, a NumPy array), None (unknown, or no tensor)."""
        if isinstance(value, self._tensor):
            if value.requires_grad or value.grad_fn is not None or isinstance(
                    value, self._parameter):
                return True
            return self.marked(value)
        if isinstance(value, self._ndarray):
            return False
        if isinstance(value, self._module):
            return any(True for _ in value.parameters()) or any(True for _ in value.buffers())
        return None

    def _line(self, frame: FrameType, *, inside_torch: bool) -> bool | None:
        """What the values the frame's line computes from say: True (one is on the device),
        False (one is on the host, none on the device), None (none says)."""
        found = self._sources.at(frame.f_code, frame.f_lineno)
        if found is None:
            return None
        return self._found(found, frame.f_locals, frame.f_globals, inside_torch)

    def _found(self, found: Found, local: Mapping[str, Any], outer: Mapping[str, Any],
               inside_torch: bool) -> bool | None:
        """What ``found``'s names say, their values looked up in ``local`` then ``outer``."""
        if found.device:
            return True  # a move to the device (x.to(device)) among what the line computes from
        host = found.host
        for name in found.names:
            if name in local:
                value = local[name]
            elif name in found.hidden:
                return True  # an enclosing function's local, out of sight: as one handed in
            else:
                value = outer.get(name)
            home = self._value(value)
            if home is None and isinstance(value, self._tensor) and not inside_torch and (
                    name not in found.assigned):
                enclosed = found.enclosed.get(name)
                # a closure's free variable: as its enclosing function computed it; a tensor
                # handed in, of no known home: as one made on the device
                home = True if enclosed is None else self._found(
                    enclosed, local, outer, inside_torch) is not False
            if home:
                return True
            host = host or home is False
        return False if host else None

    def _value(self, value: Any) -> bool | None:
        if isinstance(value, (list, tuple)):
            items: Any = value[:_PEEK]
        elif isinstance(value, dict):
            items = list(value.values())[:_PEEK]
        else:
            return self._home(value)
        homes = [self._home(item) for item in items]
        return True if True in homes else (False if False in homes else None)


def _nothing() -> None:
    pass


def _pointer(tensor: Any) -> int:
    """The data pointer of ``tensor``'s storage (0: none, or not a dense tensor's)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0


def _builder(homes: Homes, original: Callable[..., Any],
             compiling: Callable[[], bool]) -> Callable[..., Any]:
    """``original`` (``torch.zeros``), marking what it makes: on the device with ``device=``
    (unless its line writes the CPU: ``device="cpu"``, as torch's optimizers keep their step
    counters); made from a tensor by one of :data:`_FOLLOW`, where that tensor is (unmarked
    when unknown); else on the host, whoever called it (a library's ``tensor()`` helper)."""

    # torch.tensor(t), as_tensor(t), asarray(t) of a tensor: where t is
    follows = original.__name__ in _FOLLOW

    def build(*args: Any, **kwargs: Any) -> Any:
        homes.front()
        out = original(*args, **kwargs)
        if not compiling():
            device = kwargs.get("device")
            if device is not None:
                homes.mark(out, not (
                    names_the_host(device) and homes.writes_cpu(sys._getframe(1))))
            elif not follows or not homes.copied(out, args[0] if args else kwargs.get("data")):
                homes.mark(out, False)
        return out

    build.__module__, build.__qualname__ = "torch", original.__name__
    build.__name__, build.__doc__ = original.__name__, original.__doc__
    return build
