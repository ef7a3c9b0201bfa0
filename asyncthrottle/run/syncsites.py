"""The script's host reads of device values by line: CUDA's sync warnings, or (elsewhere) the reads
that would sync on an accelerator."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ..parts.syncaudit import SyncAudit, short_path

if TYPE_CHECKING:
    from .patches import Patches

__all__ = ["CUDA_SYNC", "SyncSites"]

# the call name of a sync CUDA reports outside every patched read (an op this audit does not name)
CUDA_SYNC = "CUDA sync"
# torch.Tensor's read methods (all but indexing, which reads with a mask only) and torch's functions
_TENSOR_READS = (
    "item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "__array__", "cpu",
    "to", "__repr__", "__str__", "__format__", "nonzero", "argwhere", "masked_select", "unique",
    "unique_consecutive", "equal", "allclose", "__contains__",
)
_TORCH_READS = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal",
                "allclose")
_COPIES = ("Tensor.cpu", "Tensor.to")
# a function naming one of these builds tensors from host data (a logger's torch.tensor(deque))...
_HOST_BUILDERS = frozenset(("tensor", "as_tensor", "from_numpy"))
# ...unless it also names a device (.to(), .cuda(), device=) or trains (a loop's backward())
_DEVICE_NAMES = frozenset(("to", "cuda", "device", "backward"))
# what a frame's file is: the standard library's, torch's, this library's, the runner's (which runs
# the script and calls none of its code back), an installed package's (its path in a 1-tuple), else
# the script's path
_STDLIB, _TORCH, _OURS, _RUNS = 0, 1, 2, 3
_RUNNER = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PACKAGE = os.path.dirname(_RUNNER.rstrip(os.sep)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_SITE_DIRS = tuple(os.sep + name + os.sep for name in ("site-packages", "dist-packages"))

Where = tuple[str, int]
# where a read is counted: the script's path and line, and the installed package's frame it was
# made in (None: the script's own read)
Site = tuple[str, int, Where | None]
# a count's key: path, line, call, in a step, via
Key = tuple[str, int, str, bool, Where | None]
Kind = int | str | tuple[str]


class SyncSites:
    """Counts each host read of a tensor by the script's code, by line, in steps and outside them.

    ``start()`` patches the read methods of ``torch.Tensor`` (``item``, ``__bool__``/``__float__``/
    ``__int__``/``__index__``, ``tolist``, ``numpy``/``__array__``, ``cpu``, ``to`` a host
    device, ``__repr__``/``__str__``/``__format__``, ``nonzero``, ``argwhere``, ``masked_select``,
    ``unique``, ``unique_consecutive``, ``equal``, ``allclose``, ``x in t``, indexing by a
    boolean or uint8 mask) and the torch functions of the same names, and one-argument
    ``torch.where``; no other op is touched, so ops that are not reads pay nothing. A method read
    is seen as its method is looked up (the method then runs as torch's own, called from the
    script's frame: its warnings, tracebacks and pickling are torch's); ``torch.compile`` sees
    torch's methods and functions. A read is counted at the script's frame: the innermost frame
    outside the standard library and torch, as ``file.py:LINE`` (relative to the longest of
    ``roots`` that holds it, else to its ``sys.path`` entry). A read made by an installed
    package (a file below a ``site-packages`` or ``dist-packages`` folder that is not below
    ``roots``: the HF Trainer's, Lightning's) is counted at the script's frame that called into
    it, with ``via``, the package's innermost frame; with no script frame outside (a framework's
    thread), at the package's frame, as a script's. A read made by this library's code (its
    deferred values, the runner's hooks) is the library's and is not counted, nor (off CUDA) one
    made by a callback or a package the library calls (``on_complete``: its values are host
    copies); neither is a read inside a counted one (``repr`` calling ``item``), nor a read of
    the tensor a counted ``cpu()``/``to()`` returned on the same line (``x.cpu().numpy()``).

    Once CUDA is initialised, CUDA says what syncs: its sync debug mode warns (``"warn"``, set
    as the script starts CUDA: ``start()`` initialises nothing) and a read counts when it
    synced, a sync outside every patched read as :data:`CUDA_SYNC`; a read inside torch's own
    code counts there too, at the script's line that called torch. Elsewhere (the CPU, MPS, CUDA
    never started) every read counts, as it would sync on an accelerator, except those that stay
    on the host on any device: reads torch's own code makes (an optimizer's step counter), reads
    while the DataLoader fetches (``loading``: a dataset's transforms), and reads of a tensor
    with no autograd history in a function (not a script's top level) that builds tensors from
    host data (``torch.tensor``/``as_tensor``/``from_numpy``) and names no device and no
    ``backward`` (a logger's
    ``torch.tensor(list(deque)).median().item()``); ``to()`` counts only from a device tensor.

    Only the thread that called ``start()`` (the script's) is counted: a read on another thread
    (a prefetch thread's ``cpu()``) blocks that thread, not the loop, and is neither in a step
    nor outside one; the input wait tells of a slow producer.

    Attributes:
        loading: set by the caller: True while the DataLoader fetches a batch.
    """

    def __init__(self, roots: Sequence[str], *, cuda: Any = None) -> None:
        """Args:
            roots: the script's folders (its sites are named relative to them).
            cuda: ``torch.cuda`` (None) or a stand-in with its ``_lazy_call`` and sync debug mode.
        """
        if isinstance(roots, (str, bytes)) or not all(isinstance(r, str) for r in roots):
            raise TypeError(f"roots must be a list of folder paths (str), got {roots!r}: pass "
                            f"[{roots!r}] for one folder")
        self._roots = sorted((os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots),
                             key=len, reverse=True)
        self.loading = False
        self._in_step = self._marked = self._merged = False
        self._counts: dict[Key, int] = {}
        # the open (or last) step's reads: the part before mark_tail() and the one after it
        self._parts: list[dict[Key, int]] = [{}]
        self._part = self._parts[0]
        self._kinds: dict[str, Kind] = {}
        self._hosts: dict[CodeType, bool] = {}
        self._thread: int | None = None
        self._started = self._cuda_on = False
        self._copy: tuple[int, Site] | None = None
        self._str: tuple[int, int] | None = None
        # on CUDA: the read looked up last (call, its frame's id and line) and the instruction
        # of the frame when it first synced (-1: not yet)
        self._pending: tuple[str, int, int] | None = None
        self._synced_lasti = -1
        self._cuda = cuda
        self._audit: SyncAudit | None = None
        self._previous_mode: Any = 0

    # -- steps ---------------------------------------------------------------------------------

    @property
    def in_step(self) -> bool:
        """True while the script is inside a step (set by the caller at its open and close)."""
        return self._in_step

    @in_step.setter
    def in_step(self, value: bool) -> None:
        if value == self._in_step:
            return
        self._in_step = value
        if value:
            self._part = {}
            self._parts = [self._part]
            self._marked = self._merged = False
        else:
            self._merge(1)

    def discard_step(self) -> None:
        """The step opened last was none: its reads (so far) are outside steps."""
        if self._merged:
            self._merge(-1)
        counts = self._counts
        for part in self._parts:
            for (path, line, call, _, via), count in part.items():
                key = (path, line, call, False, via)
                counts[key] = counts.get(key, 0) + count
        self._part = {}
        self._parts = [self._part]
        self._marked = False

    def mark_tail(self) -> None:
        """The open step's tail starts: :meth:`tail_rows` gives its reads from now on."""
        self._part = {}
        self._parts.append(self._part)
        self._marked = True

    def tail_rows(self) -> list[dict[str, Any]]:
        """The rows of the reads in the step since :meth:`mark_tail` (none before a mark in the
        step opened last), ``per_step`` their count."""
        return self._format(self._part, 1) if self._marked else []

    def _merge(self, sign: int) -> None:
        counts = self._counts
        for part in self._parts:
            for key, count in part.items():
                total = counts.get(key, 0) + sign * count
                if total:
                    counts[key] = total
                else:
                    counts.pop(key, None)
        self._merged = sign > 0

    # -- the report ----------------------------------------------------------------------------

    def rows(self, steps: int) -> list[dict[str, Any]]:
        """One row per site, call, in/out of steps and ``via``, the most frequent first;
        ``per_step`` is ``count / steps`` (0.0 for 0 steps); ``via``: the installed package's
        ``file.py:LINE`` that made the read, or None for the script's own; ``file``: the
        site's absolute path (``site`` is for display)."""
        counts = dict(self._counts)
        if self._in_step:
            for part in self._parts:
                for key, count in part.items():
                    counts[key] = counts.get(key, 0) + count
        return self._format(counts, steps)

    def _format(self, counts: dict[Key, int], steps: int) -> list[dict[str, Any]]:
        ordered = sorted(counts.items(), key=lambda item: (
            -item[1], self._relative(item[0][0]), item[0][1], item[0][2], not item[0][3],
            self._via(item[0][4]) or ""))
        return [{"site": f"{self._relative(path)}:{line}", "call": call, "count": count,
                 "per_step": count / steps if steps > 0 else 0.0, "in_step": in_step,
                 "via": self._via(via), "file": path}
                for (path, line, call, in_step, via), count in ordered]

    def _via(self, via: Where | None) -> str | None:
        return None if via is None else f"{self._relative(via[0])}:{via[1]}"

    def _relative(self, path: str) -> str:
        if path.startswith("<"):
            return path
        if not self._installed(path):  # a package in the script's .venv: from its sys.path entry
            for root in self._roots:
                if path.startswith(root):
                    return path[len(root):]
        return short_path(path)

    # -- install and undo ----------------------------------------------------------------------

    def start(self, patches: Patches) -> None:
        """Patch the reads through ``patches`` (whose ``undo()`` takes them away, with the sync
        debug mode and its warning hook) and watch CUDA's syncs from when the script starts
        CUDA; initialises nothing. A second call does nothing."""
        if self._started:
            return
        import torch

        self._started = True
        self._thread = threading.get_ident()
        self._torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        for name in _TENSOR_READS:
            patches.replace(torch.Tensor, name, functools.partial(_method, self, name))
        patches.replace(torch.Tensor, "__getitem__", functools.partial(_mask_read, self))
        for name in _TORCH_READS:
            patches.replace(torch, name, functools.partial(_function, self, name))
        patches.replace(torch, "where", functools.partial(_where_read, self))
        if self._cuda is None:
            self._cuda = torch.cuda
        patches.call(self._cuda_off)
        lazy = getattr(self._cuda, "_lazy_call", None)
        if lazy is not None:
            lazy(self._cuda_started)  # now, if CUDA is already initialised

    def stop(self) -> None:
        """Count nothing more (the patches stay until their undo, passing every call on)."""
        self._thread = None
        if self._audit is not None:
            self._audit.stop()

    def _cuda_started(self) -> None:
        """CUDA initialises (torch's lazy init calls this): its sync warnings now decide."""
        if self._thread is None or self._cuda_on:
            return
        self._previous_mode = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode("warn")
        self._cuda_on = True
        self._audit = SyncAudit(on_sync=self._synced_at)
        self._audit.start(new_step=False, thread=self._thread)

    def _cuda_off(self) -> None:
        """Undo what CUDA's start did (the sync debug mode, the warning hook), or drop the call
        torch's lazy init still holds."""
        if self._audit is not None:
            self._audit.uninstall()
            self._audit = None
        queued = getattr(self._cuda, "_queued_calls", None)
        if isinstance(queued, list):
            queued[:] = [call for call in queued if call[0] != self._cuda_started]
        if self._cuda_on:
            self._cuda.set_sync_debug_mode(self._previous_mode)
        self._cuda_on = False
        self._thread = self._copy = self._pending = None

    # -- counting ------------------------------------------------------------------------------

    def _seen(self, call: str, tensor: Any, frame: FrameType) -> None:
        """A read of the script's thread is about to run, called from ``frame``: count it (off
        CUDA), or keep it for CUDA's warning to name."""
        if self.loading:
            return
        if call == "Tensor.__repr__" and self._str == (id(frame), frame.f_lasti):
            self._str = None
            return  # str(x) calls repr(x)
        self._str = (id(frame), frame.f_lasti) if call == "Tensor.__str__" else None
        if self._cuda_on:
            self._pend(call, frame)
            return
        where = self._where(frame, through_torch=False)
        if where is None:
            return
        copy, self._copy = self._copy, None
        if copy is not None and copy == (id(frame), where) and call not in _COPIES:
            return  # x.cpu().numpy(): one read
        if tensor is not None and self._host_only(frame.f_code, tensor):
            return
        if call in _COPIES:
            self._copy = (id(frame), where)
        self._add(where, call)

    def _add(self, where: Site, call: str) -> None:
        if self._in_step:
            part, key = self._part, (where[0], where[1], call, True, where[2])
            part[key] = part.get(key, 0) + 1
        else:
            counts, key = self._counts, (where[0], where[1], call, False, where[2])
            counts[key] = counts.get(key, 0) + 1

    def _host_only(self, code: CodeType, tensor: Any) -> bool:
        """Whether a tensor read by ``code`` was built there from host data (no autograd
        history, in a function that builds tensors and names no device)."""
        builds = self._hosts.get(code)
        if builds is None:
            names = set(code.co_names).union(
                *(c for c in code.co_consts if isinstance(c, tuple)
                  and all(isinstance(n, str) for n in c)))
            # a function's: a script's top level builds what it trains on too
            builds = self._hosts[code] = code.co_name != "<module>" and bool(
                names & _HOST_BUILDERS) and not (names & _DEVICE_NAMES)
        return builds and tensor.grad_fn is None and not tensor.requires_grad

    def _pend(self, call: str, frame: FrameType) -> None:
        if self._kind_of(frame.f_code.co_filename) == _TORCH:
            caller = self._caller(frame)
            if caller is None or (self._pending is not None and self._synced_lasti < 0 and (
                    self._pending[1:] == (id(caller), caller.f_lineno))):
                return  # a read inside the script's read (repr's item()): that one names it
            frame = caller
        self._pending, self._synced_lasti = (call, id(frame), frame.f_lineno), -1
        if self._audit is not None:
            self._audit.install()

    def _synced_at(self, frame: FrameType | None) -> None:
        """CUDA warned of a sync on the script's thread: the read looked up last on the line
        made it, else count it under :data:`CUDA_SYNC`."""
        if self.loading:
            return
        where = self._where(frame, through_torch=True)
        if where is None:
            return
        call, caller, pending = CUDA_SYNC, self._caller(frame), self._pending
        if caller is not None and pending is not None and (id(caller), caller.f_lineno) == (
                pending[1], pending[2]):
            if caller.f_lasti == self._synced_lasti:
                return  # the same read synced again
            if self._synced_lasti < 0:
                call, self._synced_lasti = pending[0], caller.f_lasti
        self._add(where, call)

    def _caller(self, frame: FrameType | None) -> FrameType | None:
        """The innermost frame outside the standard library and torch."""
        while frame is not None and self._kind_of(frame.f_code.co_filename) in (_STDLIB, _TORCH):
            frame = frame.f_back
        return frame

    def _kind_of(self, name: str) -> Kind:
        kind = self._kinds.get(name)
        if kind is None:
            kind = self._kinds[name] = self._kind(name)
        return kind

    def _copied(self, bound: Any, frame: FrameType, *args: Any, **kwargs: Any) -> Any:
        """A device tensor's ``to()`` off CUDA: a read when it copies to the host and waits."""
        out = bound(*args, **kwargs)
        if not (kwargs.get("non_blocking") or any(a is True for a in args)) and out.is_cpu:
            self._seen("Tensor.to", None, frame)
        return out

    # -- where a read is

    def _where(self, frame: FrameType | None, *, through_torch: bool) -> Site | None:
        """The script's frame and line from ``frame`` outwards, with the innermost installed
        package's frame passed on the way (``via``); the package's frame itself where no script
        frame is outside it; None for a read of torch's own code (unless ``through_torch``) or
        of this library's, or (unless ``through_torch``) of a package this library called."""
        via: Where | None = None
        while frame is not None:
            kind = self._kind_of(frame.f_code.co_filename)
            if isinstance(kind, str):
                if not through_torch and self._called_by_us(frame):
                    return None  # the library's callback (on_complete): its values are host copies
                return kind, frame.f_lineno, via
            if kind == _STDLIB or (kind == _TORCH and through_torch) or (
                    via is not None and kind in (_TORCH, _RUNS)):
                frame = frame.f_back  # past a package, torch's frames and the runner's wrappers too
            elif isinstance(kind, tuple):
                via = via or (kind[0], frame.f_lineno)
                frame = frame.f_back
            else:  # this library's code (or, with no package passed, torch's or the runner's)
                return None if via is None or not through_torch else (*via, None)
        return None if via is None else (*via, None)

    def _called_by_us(self, frame: FrameType) -> bool:
        back = frame.f_back
        return back is not None and self._kind_of(back.f_code.co_filename) == _OURS

    def _kind(self, name: str) -> Kind:
        if name.startswith("<frozen "):
            return _STDLIB
        if name.startswith("<"):
            return name
        path = os.path.abspath(name)
        if path.startswith(self._torch_dir):
            return _TORCH
        if path.startswith(_RUNNER):
            return _RUNS
        if path.startswith(_PACKAGE):
            return _OURS
        if self._installed(path):
            return (path,)
        return _STDLIB if path.startswith(_STDLIB_DIR) else path

    def _installed(self, path: str) -> bool:
        """Whether ``path`` is an installed package's: below a ``site-packages`` (or
        ``dist-packages``) folder that is not above the script's own folder (a script installed
        itself is the script's; a ``.venv`` in its folder is installed)."""
        for root in self._roots:
            if path.startswith(root):
                path = path[len(root) - 1:]
                break
        return any(folder in path for folder in _SITE_DIRS)


_get_ident = threading.get_ident


class _Read:
    """A read method of ``torch.Tensor``: the read is seen as the method is looked up on a tensor
    of the script's thread, and torch's own method is what the script then calls (so its
    warnings, tracebacks and ``stacklevel`` are as without the audit); looked up on the class,
    or while ``torch.compile`` traces, it is torch's method itself."""

    __slots__ = ("_call", "_compiling", "_get", "_sites", "_to")

    def __init__(self, sites: SyncSites, name: str, original: Any) -> None:
        import torch

        self._sites, self._call, self._get = sites, f"Tensor.{name}", original.__get__
        self._compiling, self._to = torch.compiler.is_compiling, name == "to"

    def __get__(self, tensor: Any, owner: Any = None) -> Any:
        if tensor is None or self._compiling() or _get_ident() != self._sites._thread:
            return self._get(tensor, owner)
        bound, sites = self._get(tensor, owner), self._sites
        if self._to and not sites._cuda_on:
            # off CUDA, a host tensor's to() is the script's host-to-device copy
            return bound if tensor.is_cpu else functools.partial(
                sites._copied, bound, sys._getframe(1))
        sites._seen(self._call, tensor, sys._getframe(1))
        return bound


def _method(sites: SyncSites, name: str, original: Any) -> _Read:
    return _Read(sites, name, original)


def _mask_read(sites: SyncSites, original: Any) -> Callable[[Any, Any], Any]:
    """``Tensor.__getitem__``: a read when the key is a boolean (or uint8) mask; any other key
    costs one type test."""
    import torch

    tensor_type, masks = torch.Tensor, (torch.bool, torch.uint8)
    compiling = torch.compiler.is_compiling

    def getitem(tensor: Any, key: Any) -> Any:
        # the type test first: an index of a compiled graph traces it and goes on
        if key.__class__ is tensor_type and key.dtype in masks and not compiling() and (
                _get_ident() == sites._thread):
            sites._seen("Tensor.__getitem__", tensor, sys._getframe(1))
        return original(tensor, key)

    return _named(getitem, original, "Tensor.__getitem__")


def _function(sites: SyncSites, name: str, original: Any) -> Callable[..., Any]:
    """A torch function that reads (``torch.nonzero``)."""
    import torch

    compiling, call, tensor_type = torch.compiler.is_compiling, f"torch.{name}", torch.Tensor

    def read(*args: Any, **kwargs: Any) -> Any:
        if not compiling() and _get_ident() == sites._thread:
            first = args[0] if args else kwargs.get("input")
            sites._seen(call, first if isinstance(first, tensor_type) else None, sys._getframe(1))
        return original(*args, **kwargs)

    return _named(read, original, name)


def _where_read(sites: SyncSites, original: Any) -> Callable[..., Any]:
    """``torch.where``: a read in its one-argument form (``torch.where(cond)``) only."""
    import torch

    compiling, tensor_type = torch.compiler.is_compiling, torch.Tensor

    def where(*args: Any, **kwargs: Any) -> Any:
        if len(args) + len(kwargs) == 1 and not compiling() and _get_ident() == sites._thread:
            first = args[0] if args else next(iter(kwargs.values()))
            sites._seen("torch.where", first if isinstance(first, tensor_type) else None,
                        sys._getframe(1))
        return original(*args, **kwargs)

    return _named(where, original, "where")


def _named(wrapper: Callable[..., Any], original: Any, qualname: str) -> Callable[..., Any]:
    """``wrapper`` named as ``torch.<qualname>``, so pickle finds it where it finds the
    original."""
    wrapper.__module__, wrapper.__qualname__ = "torch", qualname
    wrapper.__name__ = qualname.rpartition(".")[2]
    wrapper.__doc__ = original.__doc__
    return wrapper
