"""``forbid_syncs()``: a unit test fails at the first host read of a device value, on a CI machine
with no GPU as on CUDA.

torch's ``set_sync_debug_mode("error")`` works on CUDA only, so a ``.item()`` put back into a
training step passes every CPU test. Inside :func:`forbid_syncs` the reads that ``python -m
asyncthrottle run`` counts as sync sites raise :class:`SyncError` instead, by the same rule: off
CUDA, each read that would sync on an accelerator; on CUDA, what its sync debug mode reports.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from ..audit.frames import Site
    from ..audit.patches import Patches
    from ..audit.syncsites import SyncSites

__all__ = ["ForbidSyncs", "SyncError", "forbid_syncs"]

_F = TypeVar("_F", bound=Callable[..., Any])
# repr() replaces an error raised as its method is looked up by the default repr: this read raises
# when its block ends
_SWALLOWED = "Tensor.__repr__"


class SyncError(RuntimeError):
    """A host read of a device value inside :func:`forbid_syncs` (a host-device sync on an
    accelerator).

    Attributes:
        call: the read, as ``run``'s report names it (``"Tensor.item"``, ``"Tensor.__bool__"``,
            ``"CUDA sync"``).
        site: the line that made it, ``file.py:LINE`` (relative to the working directory, else
            to its ``sys.path`` entry).
        path: that line's file (absolute).
        line: its line number.
        via: the installed package's line that made the read for it
            (``"transformers/trainer.py:1919"``), or None: the line's own read.
    """

    def __init__(self, call: str, site: str, path: str, line: int, via: str | None = None) -> None:
        self.call, self.site, self.path, self.line, self.via = call, site, path, line, via
        made = f" (made by {via})" if via is not None else ""
        super().__init__(
            f"{call} at {site}{made} reads a device value on the host inside forbid_syncs(): on "
            "an accelerator that waits for the device (a host-device sync). Keep the value on "
            "the device (log it every N steps, or defer it with a Throttle), or allow this "
            f"read: forbid_syncs(allow=({call!r},))")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.call, self.site, self.path, self.line, self.via), self.__dict__


class ForbidSyncs(contextlib.ContextDecorator):
    """What :func:`forbid_syncs` returns: a context manager, and a decorator that runs the
    function inside it (its wrapper is :class:`contextlib.ContextDecorator`'s, of the standard
    library, so the function's reads stay its own).

    Attributes:
        allow: the calls allowed inside the block.
    """

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allow = _checked(allow)

    def __call__(self, func: _F) -> _F:
        """``func`` run inside the block (``functools.wraps``)."""
        if inspect.iscoroutinefunction(func) or inspect.isgeneratorfunction(func) or (
                inspect.isasyncgenfunction(func)):
            raise TypeError(f"forbid_syncs() cannot watch {func.__qualname__}: its body runs "
                            "after the call returns (a coroutine or generator function); use "
                            "`with forbid_syncs():` inside it")
        return super().__call__(func)

    def __enter__(self) -> ForbidSyncs:
        global _watch
        with _lock:
            if _watch is None:
                watch = _Watch()
                watch.start()
                _watch = watch
            elif _watch.sites.thread != threading.get_ident():
                raise RuntimeError(
                    f"forbid_syncs() is already watching thread {_watch.sites.thread} and watches "
                    f"one thread at a time; this is thread {threading.get_ident()}: end the "
                    "other thread's block first, or forbid the syncs in one thread")
            _watch.allowed.append(self.allow)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _watch
        with _lock:
            watch = _watch
            assert watch is not None, "forbid_syncs() exited more often than it was entered"
            watch.allowed.pop()
            late, watch.late = watch.late, None
            if not watch.allowed:
                _watch = None
                watch.stop()
        if late is not None and kind is None:
            raise late


@overload
def forbid_syncs(func: _F, /) -> _F: ...


@overload
def forbid_syncs(*, allow: Iterable[str] = ()) -> ForbidSyncs: ...


def forbid_syncs(func: Any = None, /, *, allow: Iterable[str] = ()) -> Any:
    """Raise :class:`SyncError` at the first host read of a device value inside the block (or
    the decorated function), at the line that made it, as ``python -m asyncthrottle run`` would
    count it:

    - off CUDA (the CPU of a CI machine, MPS, CUDA not started), each read that would sync on an
      accelerator: ``.item()``, ``float(t)``, ``if t:``, ``.tolist()``, ``.cpu()``, ``print(t)``,
      ``x[mask]``, ``torch.nonzero`` ... (the calls listed in ``docs/run.md``, Sync sites), by
      where the tensor would live there: a module's parameters and buffers, what is moved
      (``to(device)``) or made (``device=``) there and what is computed from them, torch's own
      reads of those included (``clip_grad_norm_(error_if_nonfinite=True)``); not the reads
      of tensors built from Python or NumPy data and computed only from such (a one-cycle
      schedule, an optimizer's step counter, a metric logger's median), nor those while a
      DataLoader fetches a batch;
    - once CUDA is initialised, what its sync debug mode reports (``"warn"`` inside the block,
      the previous mode back at its end), named by the read that synced, else ``"CUDA sync"``.

    Reads made by this library are not counted; a read made by an installed package is raised
    at the line that called it (``via``: the package's line). Only the thread that entered the
    block is watched (a second thread's block raises RuntimeError while one is open); at the end
    of the outermost block torch's methods are torch's own again (also when the body raised).
    ``repr(t)`` cannot raise (Python replaces the error by the default repr): its SyncError is
    raised when the block ends.

    Everything in the block counts, the test's own ``assert loss.item() < 1`` too: wrap the
    training step, not the test, or allow the call. Blocks nest: an inner ``allow`` adds to the
    outer one (a block can only allow more than the block around it).

    Args:
        func: a function to decorate (``@forbid_syncs``); with ``allow``, use
            ``@forbid_syncs(allow=...)``.
        allow: the calls allowed inside, by their names in ``run``'s report
            (``("Tensor.item",)``; ``"CUDA sync"``).

    Returns:
        A :class:`ForbidSyncs` (``with forbid_syncs():``, ``@forbid_syncs()``), or ``func``
        wrapped (``functools.wraps``: its name and signature kept, pytest's fixtures too).

    Raises:
        ValueError: ``allow`` names a call that is no read (the message lists the known ones).
        TypeError: ``allow`` is a string, not a tuple of them, or ``func`` is not callable.
    """
    if func is None:
        return ForbidSyncs(allow)
    if not callable(func):
        raise TypeError(f"forbid_syncs() takes a function to decorate, got {func!r}: name the "
                        f"calls to allow as forbid_syncs(allow=...)")
    return ForbidSyncs(allow)(func)


def _checked(allow: Iterable[str]) -> frozenset[str]:
    """``allow`` as a set of known call names."""
    from ..audit.cudasyncs import CUDA_SYNC
    from ..audit.reads import CALLS

    if isinstance(allow, str) or not isinstance(allow, Iterable):
        raise TypeError(f"allow must be a tuple of call names, got {allow!r}: e.g. "
                        f"allow=({allow!r},)")
    names, known = tuple(allow), (*CALLS, CUDA_SYNC)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"allow names {name!r}, which is no read forbid_syncs() knows{hint}; "
                             f"the calls: {', '.join(known)}")
    return frozenset(names)


def _cuda() -> Any:
    """``torch.cuda`` for the audit (None: torch's own); tests put a stand-in here."""
    return None


class _Watch:
    """The audit that the open blocks of one thread share: installed by the outermost block's
    entry, undone by its exit.

    Attributes:
        sites: the audit (its ``on_read`` raises).
        allowed: each open block's ``allow``, the innermost last.
        late: the SyncError of a ``repr()`` (raised when a block ends).
    """

    def __init__(self) -> None:
        from ..audit.patches import Patches
        from ..audit.syncsites import SyncSites

        self.allowed: list[frozenset[str]] = []
        self.late: SyncError | None = None
        self._patches = Patches()
        self.sites = SyncSites([os.getcwd()], cuda=_cuda(), on_read=self._read)

    def start(self) -> None:
        """Patch torch's reads and the DataLoader's fetch; all undone when that fails."""
        try:
            self.sites.start(self._patches)
            _fetching(self.sites, self._patches)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.sites.stop()
        self._patches.undo()

    def _read(self, call: str, where: Site) -> None:
        """A read of the watched thread: raise unless an open block allows it."""
        __tracebackhide__ = True  # pytest shows the test's line, not this one
        if any(call in allowed for allowed in self.allowed):
            return
        site, via = self.sites.named(where)
        error = SyncError(call, site, where[0], where[1], via)
        if call != _SWALLOWED:
            raise error
        self.late = self.late or error


def _fetching(sites: SyncSites, patches: Patches) -> None:
    """While the watched thread's DataLoader fetches a batch, its dataset's reads stay on the
    host on any device: ``sites.loading`` (as ``run`` sets it)."""
    from torch.utils.data import dataloader

    def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        @functools.wraps(original)
        def _next_data(iterator: Any) -> Any:
            if sites.loading or threading.get_ident() != sites.thread:
                return original(iterator)
            sites.loading = True
            try:
                return original(iterator)
            finally:
                sites.loading = False
        return _next_data

    for name in ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter"):
        patches.replace(getattr(dataloader, name), "_next_data", make)


_lock = threading.Lock()
# the open blocks' audit (None: no block is open)
_watch: _Watch | None = None
