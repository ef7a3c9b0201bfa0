"""The patched reads: torch.Tensor's read methods, indexing by a mask, torch's read functions."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from .callerwarnings import CallerWarnings

if TYPE_CHECKING:
    from .patches import Patches
    from .syncsites import SyncSites

__all__ = ["CALLS", "patch_reads"]

# torch.Tensor's read methods (all but indexing, which reads with a mask only) and torch's functions
_TENSOR_READS = (
    "item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "__array__", "cpu",
    "to", "__repr__", "__str__", "__format__", "nonzero", "argwhere", "masked_select", "unique",
    "unique_consecutive", "equal", "allclose", "__contains__",
)
_TORCH_READS = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal",
                "allclose")
# every name a read is counted under (CUDA adds CUDA_SYNC): "Tensor.item", "torch.where", ...
CALLS = (*(f"Tensor.{name}" for name in (*_TENSOR_READS, "__getitem__")),
         *(f"torch.{name}" for name in (*_TORCH_READS, "where")))

_get_ident = threading.get_ident
_setprofile = sys.setprofile


def patch_reads(sites: SyncSites, patches: Patches) -> None:
    """Patch torch's reads through ``patches`` (whose ``undo()`` takes them away), each read of
    the script's thread (``sites.thread``) told to ``sites.seen()``."""
    import torch

    # torch's read methods written in Python (__repr__, unique): the timer waits for their
    # frame's return
    codes = {code for name in _TENSOR_READS
             if isinstance(code := getattr(getattr(torch.Tensor, name), "__code__", None),
                           CodeType)}
    sites.timer.know(_Read.__get__.__code__, frozenset(codes),
                     torch._C._autograd._profiler_enabled)
    # the wrappers' own frames stand between the script and torch: their warnings are the
    # script's line's
    warned = CallerWarnings(__name__)
    warned.start(patches)
    front = warned.front
    for name in _TENSOR_READS:
        patches.replace(torch.Tensor, name, functools.partial(_Read, sites, front, name))
    patches.replace(torch.Tensor, "__getitem__", functools.partial(_mask_read, sites, front))
    for name in _TORCH_READS:
        patches.replace(torch, name, functools.partial(_function, sites, front, name))
    patches.replace(torch, "where", functools.partial(_function, sites, front, "where",
                                                      one_argument=True))


class _Read:
    """A read method of ``torch.Tensor``: the read is seen as the method is looked up on a tensor
    of the script's thread, and torch's own method is what the script then calls (so its
    warnings, tracebacks and ``stacklevel`` are as without the audit); looked up on the class,
    or while ``torch.compile`` traces, it is torch's method itself. A counted read's time
    blocked is taken by ``sites.timer``'s profile function, installed here as the lookup's last
    act (see :class:`~asyncthrottle.audit.blocked.ReadTimer`)."""

    __slots__ = ("_call", "_compiling", "_cuda", "_front", "_get", "_profile", "_sites", "_timer",
                 "_to")

    def __init__(self, sites: SyncSites, front: Callable[[], None], name: str,
                 original: Any) -> None:
        import torch

        self._sites, self._cuda, self._call = sites, sites.cuda, f"Tensor.{name}"
        self._front = front
        self._get, self._to = original.__get__, name == "to"
        self._compiling = torch.compiler.is_compiling
        self._timer = sites.timer
        self._profile = sites.timer.profile

    def __get__(self, tensor: Any, owner: Any = None) -> Any:
        if _get_ident() != self._sites.thread:
            return self._get(tensor, owner)
        if tensor is None or self._compiling():
            got = self._get(tensor, owner)
        elif self._to and not self._cuda.on:
            # off CUDA, a host tensor's to() is the script's host-to-device copy
            bound = self._get(tensor, owner)
            got = bound if tensor.is_cpu else functools.partial(
                _copied, self._sites, self._front, bound, sys._getframe(1))
        else:
            got, frame = self._get(tensor, owner), sys._getframe(1)
            if self._sites.seen(self._call, tensor, frame) and self._sites.time_read(got, frame):
                _setprofile(self._profile)
                return got
        if self._timer.paused and self._timer.resume():
            _setprofile(self._profile)  # a lookup inside a timed read (str's __repr__)
        return got


def _copied(sites: SyncSites, front: Callable[[], None], bound: Any, frame: FrameType,
            *args: Any, **kwargs: Any) -> Any:
    """A device tensor's ``to()`` off CUDA: a read when it copies to the host and waits."""
    front()
    clock = sites.clock
    start = clock()
    out = bound(*args, **kwargs)
    if not (kwargs.get("non_blocking") or any(a is True for a in args)) and out.is_cpu and (
            sites.seen("Tensor.to", None, frame) and sites.timing()):
        sites.blocked(clock() - start)
    return out


def _mask_read(sites: SyncSites, front: Callable[[], None],
               original: Any) -> Callable[[Any, Any], Any]:
    """``Tensor.__getitem__``: a read when the key is a boolean (or uint8) mask; any other key
    costs one type test."""
    import torch

    tensor_type, masks = torch.Tensor, (torch.bool, torch.uint8)
    compiling = torch.compiler.is_compiling

    def getitem(tensor: Any, key: Any) -> Any:
        # the type test first: an index of a compiled graph traces it and goes on
        if key.__class__ is tensor_type and key.dtype in masks and not compiling():
            front()
            if _get_ident() == sites.thread and sites.seen(
                    "Tensor.__getitem__", tensor, sys._getframe(1)) and sites.timing():
                start = sites.clock()
                try:
                    return original(tensor, key)
                finally:
                    sites.blocked(sites.clock() - start)
        return original(tensor, key)

    return _named(getitem, original, "Tensor.__getitem__")


def _function(sites: SyncSites, front: Callable[[], None], name: str, original: Any, *,
              one_argument: bool = False) -> Callable[..., Any]:
    """A torch function that reads (``torch.nonzero``); with ``one_argument``, in its
    one-argument form only (``torch.where(cond)``)."""
    import torch

    compiling, call, tensor_type = torch.compiler.is_compiling, f"torch.{name}", torch.Tensor

    def read(*args: Any, **kwargs: Any) -> Any:
        if (not one_argument or len(args) + len(kwargs) == 1) and not compiling():
            front()
            first = args[0] if args else kwargs.get("input", kwargs.get("condition"))
            if _get_ident() == sites.thread and sites.seen(
                    call, first if isinstance(first, tensor_type) else None,
                    sys._getframe(1)) and sites.timing():
                start = sites.clock()
                try:
                    return original(*args, **kwargs)
                finally:
                    sites.blocked(sites.clock() - start)
        return original(*args, **kwargs)

    return _named(read, original, name)


def _named(wrapper: Callable[..., Any], original: Any, qualname: str) -> Callable[..., Any]:
    """``wrapper`` named as ``torch.<qualname>``, so pickle finds it where it finds the
    original."""
    wrapper.__module__, wrapper.__qualname__ = "torch", qualname
    wrapper.__name__ = qualname.rpartition(".")[2]
    wrapper.__doc__ = original.__doc__
    return wrapper
