"""The script's host reads of device values by line: CUDA's sync warnings, or (elsewhere) the reads
that would sync on an accelerator."""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, cast

from ..backends import torch as torch_backend
from ..parts.syncaudit import SyncAudit, _short

__all__ = ["CUDA_SYNC", "SyncSites"]

# the call name of a sync CUDA reports outside every patched read (an op this audit does not name)
CUDA_SYNC = "CUDA sync"
# (owner, attribute): torch.Tensor's read methods and the torch functions that read
_TENSOR_READS = (
    "item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "__array__", "cpu",
    "to", "__repr__", "__str__", "__format__", "nonzero", "argwhere", "masked_select", "unique",
    "unique_consecutive", "__getitem__",
)
_TORCH_READS = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive")
_COPIES = ("Tensor.cpu", "Tensor.to")
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
    ``unique``, ``unique_consecutive``, indexing by a boolean mask) and the torch functions of the
    same names; no other op is touched, so ops that are not reads pay nothing. A read is counted
    at the script's frame: the innermost frame outside the standard library and torch, as
    ``file.py:LINE`` (relative to the longest of ``roots`` that holds it, else to its
    ``sys.path`` entry). A read made by an installed package (a file below a ``site-packages``
    or ``dist-packages`` folder that is not below ``roots``: the HF Trainer's, Lightning's) is
    counted at the script's frame that called into it, with ``via``, the package's innermost
    frame; with no script frame outside (a framework's thread), at the package's frame, as a
    script's. A read made by this library's code (its deferred values, the runner's hooks) is
    the library's and is not counted, nor (off CUDA) one made by a callback or a package the
    library calls (``on_complete``: its values are host copies); neither is a read inside a
    counted one (``repr`` calling ``item``), nor a read of the tensor a counted ``cpu()``/``to()``
    returned (``x.cpu().numpy()`` reads once).

    Once CUDA is initialised, CUDA says what syncs: its sync debug mode warns (``"warn"``, set
    as CUDA starts, so ``start()`` initialises nothing) and a read counts when it synced, a sync
    outside every patched read as :data:`CUDA_SYNC`; a read inside torch's own code counts there
    too, at the script's line that called torch. Elsewhere (the CPU, MPS, CUDA never started)
    every read counts, as it would sync on an accelerator, except those torch's own code makes
    (an optimizer's step counter, a sampler's permutation live on the host on any device), and
    ``to()`` counts only from a device tensor: on the CPU, ``x.to(device)`` is the script's
    host-to-device copy.

    Only the thread that called ``start()`` (the script's) is counted: a read on another thread
    (a prefetch thread's ``cpu()``) blocks that thread, not the loop, and is neither in a step
    nor outside one; the input wait tells of a slow producer.

    Attributes:
        in_step: set by the caller: True while the script is inside a step.
    """

    def __init__(self, roots: Sequence[str]) -> None:
        if isinstance(roots, (str, bytes)) or not all(isinstance(r, str) for r in roots):
            raise TypeError(f"roots must be a list of folder paths (str), got {roots!r}: pass "
                            f"[{roots!r}] for one folder")
        self._roots = sorted((os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots),
                             key=len, reverse=True)
        self.in_step = False
        self._counts: dict[Key, int] = {}
        self._kinds: dict[str, Kind] = {}
        self._patched: list[tuple[Any, str, Any]] = []
        self._thread: int | None = None
        self._busy = self._cuda_on = self._synced = False
        self._copy: tuple[Callable[[], Any], Site] | None = None
        self._cuda: Any = None
        self._warnings: _CudaWarnings | None = None
        self._previous_mode: Any = 0

    # -- the report ----------------------------------------------------------------------------

    def counts(self) -> dict[Key, int]:
        """The counts so far, by (path, line, call, in a step, via): a copy, cheap enough for
        every step, for ``rows(since=)``."""
        return dict(self._counts)

    def rows(self, steps: int, since: dict[Key, int] | None = None) -> list[dict[str, Any]]:
        """One row per site, call, in/out of steps and ``via``, the most frequent first;
        ``per_step`` is ``count / steps`` (0.0 for 0 steps); ``via``: the installed package's
        ``file.py:LINE`` that made the read, or None for the script's own. ``since``: only the
        reads in steps counted after that :meth:`counts`."""
        counts = self._counts
        if since is not None:
            counts = {key: count - since.get(key, 0) for key, count in counts.items()
                      if key[3] and count > since.get(key, 0)}
        ordered = sorted(counts.items(), key=lambda item: (
            -item[1], self._relative(item[0][0]), item[0][1], item[0][2], not item[0][3],
            self._via(item[0][4]) or ""))
        return [{"site": f"{self._relative(path)}:{line}", "call": call, "count": count,
                 "per_step": count / steps if steps > 0 else 0.0, "in_step": in_step,
                 "via": self._via(via)}
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
        return _short(path)

    # -- install and undo ----------------------------------------------------------------------

    def start(self) -> None:
        """Patch the reads and watch CUDA's syncs; a second call does nothing."""
        if self._thread is not None:
            return
        import torch

        self._thread = threading.get_ident()
        self._torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        try:
            for name in _TENSOR_READS:
                self._patch(torch.Tensor, name, f"Tensor.{name}")
            for name in _TORCH_READS:
                self._patch(torch, name, f"torch.{name}")
            self._cuda = torch_backend.cuda_module()
            if self._cuda is not None:
                self._warnings = _CudaWarnings(self)
                self._warnings.start(new_step=False)
                lazy = getattr(self._cuda, "_lazy_call", None)
                self._cuda_started() if lazy is None else lazy(self._cuda_started)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Undo everything ``start()`` did (the methods, the warning hook, the sync debug mode);
        the counts stay. A second call does nothing."""
        while self._patched:
            owner, name, original = self._patched.pop()
            if original is None:
                delattr(owner, name)  # the inherited method (torch._C.TensorBase's) shows again
            else:
                setattr(owner, name, original)
        if self._warnings is not None:
            self._warnings.uninstall()
            self._warnings = None
        queued = getattr(self._cuda, "_queued_calls", None)
        if isinstance(queued, list):
            queued[:] = [call for call in queued if call[0] != self._cuda_started]
        if self._cuda_on:
            self._cuda.set_sync_debug_mode(self._previous_mode)
        self._cuda = None
        self._cuda_on = self._busy = False
        self._thread = self._copy = None

    def _cuda_started(self) -> None:
        """CUDA initialises (torch's lazy init calls this): its sync warnings now decide."""
        if self._thread is None or self._cuda is None:
            return
        self._previous_mode = self._cuda.get_sync_debug_mode()
        self._cuda.set_sync_debug_mode("warn")
        self._cuda_on = True

    def _patch(self, owner: Any, name: str, call: str) -> None:
        original = getattr(owner, name)
        own = owner.__dict__.get(name)
        wrapper = _mask_read(self, original) if name == "__getitem__" else _read(
            self, call, original, from_device=name == "to")
        wrapper.__name__ = wrapper.__qualname__ = name
        wrapper.__doc__ = original.__doc__
        setattr(owner, name, wrapper)
        self._patched.append((owner, name, own))

    # -- counting ------------------------------------------------------------------------------

    def _read(self, call: str, original: Any, tensor: Any, args: Any, kwargs: Any) -> Any:
        """Run one read of the script's thread and count it at the script's line."""
        cuda = self._cuda_on
        where = self._where(sys._getframe(2), through_torch=cuda)
        if cuda and self._warnings is not None:
            self._warnings.install()
        elif self._copy is not None and self._copy[1] == where and self._copy[0]() is tensor and (
                call not in _COPIES):
            where = None  # x.cpu().numpy(): one read
        self._busy, self._synced = True, False
        try:
            out = original(tensor, *args, **kwargs)
        finally:
            self._busy = False
        if where is not None and (self._synced if cuda else call != "Tensor.to" or out.is_cpu):
            key = (where[0], where[1], call, self.in_step, where[2])
            self._counts[key] = self._counts.get(key, 0) + 1
            if call in _COPIES:
                self._copy = (weakref.ref(out), where)
        return out

    def _synced_at(self, frame: FrameType | None) -> None:
        """CUDA warned of a sync on the script's thread: the read running made it, else count it
        at its own line."""
        if self._busy:
            self._synced = True
            return
        where = self._where(frame, through_torch=True)
        if where is not None:
            key = (where[0], where[1], CUDA_SYNC, self.in_step, where[2])
            self._counts[key] = self._counts.get(key, 0) + 1

    def _where(self, frame: FrameType | None, *, through_torch: bool) -> Site | None:
        """The script's frame and line from ``frame`` outwards, with the innermost installed
        package's frame passed on the way (``via``); the package's frame itself where no script
        frame is outside it; None for a read of torch's own code (unless ``through_torch``) or
        of this library's, or (unless ``through_torch``) of a package this library called."""
        kinds = self._kinds
        via: Where | None = None
        while frame is not None:
            name = frame.f_code.co_filename
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = self._kind(name)
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
        if back is None:
            return False
        name = back.f_code.co_filename
        kind = self._kinds.get(name)
        if kind is None:
            kind = self._kinds[name] = self._kind(name)
        return kind == _OURS

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

def _read(sites: SyncSites, call: str, original: Any, from_device: bool) -> Any:
    """A read method: the original for reads that are not counted (another thread's, one inside a
    counted read; with ``from_device``, off CUDA, a host tensor's or a ``non_blocking`` one's),
    else counted."""
    get_ident = threading.get_ident

    def read(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if sites._busy or get_ident() != sites._thread or (from_device and not sites._cuda_on and (
                tensor.is_cpu or kwargs.get("non_blocking") or any(a is True for a in args))):
            return original(tensor, *args, **kwargs)
        return sites._read(call, original, tensor, args, kwargs)

    return read


def _mask_read(sites: SyncSites, original: Any) -> Any:
    """``Tensor.__getitem__``: a read when the key is a boolean mask; any other key costs one type
    test."""
    import torch

    tensor_type, bool_type, get_ident = torch.Tensor, torch.bool, threading.get_ident

    def getitem(tensor: Any, key: Any) -> Any:
        if key.__class__ is tensor_type and key.dtype is bool_type and not sites._busy and (
                get_ident() == sites._thread):
            return sites._read("Tensor.__getitem__", original, tensor, (key,), {})
        return original(tensor, key)

    return getitem


class _CudaWarnings(SyncAudit):
    """CUDA's sync warnings on the script's thread (the sync audit's hook and filter), counted by
    the sites' rule and never shown: the report lists them."""

    def __init__(self, sites: SyncSites) -> None:
        import warnings

        super().__init__()
        self._sites = sites
        self._before = warnings.showwarning  # what uninstall() puts back

    def _count(self, frame: FrameType | None) -> str:
        self._sites._synced_at(frame)
        self._shown.add("")
        return ""

    def install(self) -> None:
        """The hook and filter again if the script's ``catch_warnings`` or ``filterwarnings``
        moved them."""
        import warnings

        filters = cast(list[Any], warnings.filters)
        if filters[:1] != [self._filter]:
            if self._filter in filters:
                filters.remove(self._filter)
            self._filter = None
        self._install()

    def uninstall(self) -> None:
        import warnings

        self.stop()
        if warnings.showwarning == self._hook:
            warnings.showwarning = self._before
        filters = cast(list[Any], warnings.filters)
        if self._filter in filters:
            filters.remove(self._filter)
            warnings._filters_mutated()  # type: ignore[attr-defined]
        self._filter = None
