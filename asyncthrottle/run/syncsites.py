"""The script's host reads of device values by line: CUDA's sync warnings, or (elsewhere) the reads
that would sync on an accelerator."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from .cudasyncs import CUDA_SYNC, CudaSyncs
from .frames import Frames, Site, Where
from .reads import patch_reads

if TYPE_CHECKING:
    from .patches import Patches

__all__ = ["CUDA_SYNC", "SyncSites"]

_COPIES = ("Tensor.cpu", "Tensor.to")
# a count's key: path, line, call, in a step, via
Key = tuple[str, int, str, bool, Where | None]


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
        thread: the id of the thread counted (the script's, from ``start()``; None: none).
        cuda: CUDA's side (``cuda.on`` once the script started CUDA).
        on_read: told of each read before it is counted, ``on_read(call, where)`` (None: none);
            what it raises leaves the read uncounted and reaches the script's line
            (:func:`asyncthrottle.testing.forbid_syncs` raises there).
    """

    def __init__(self, roots: Sequence[str], *, cuda: Any = None,
                 on_read: Callable[[str, Site], None] | None = None) -> None:
        """Args:
            roots: the script's folders (its sites are named relative to them).
            cuda: ``torch.cuda`` (None) or a stand-in with its ``_lazy_call`` and sync debug mode.
            on_read: see the attribute.
        """
        self.on_read = on_read
        self._frames = Frames(roots)
        self.loading = False
        self._in_step = self._marked = self._merged = False
        self._counts: dict[Key, int] = {}
        # the open (or last) step's reads: the part before mark_tail() and the one after it
        self._parts: list[dict[Key, int]] = [{}]
        self._part = self._parts[0]
        self.thread: int | None = None
        self._started = False
        self._copy: tuple[int, Site] | None = None
        self._str: tuple[int, int] | None = None
        self.cuda = CudaSyncs(self, self._frames, cuda)

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
            -item[1], self._frames.relative(item[0][0]), item[0][1], item[0][2], not item[0][3],
            self._via(item[0][4]) or ""))
        return [{"site": f"{self._frames.relative(path)}:{line}", "call": call, "count": count,
                 "per_step": count / steps if steps > 0 else 0.0, "in_step": in_step,
                 "via": self._via(via), "file": path}
                for (path, line, call, in_step, via), count in ordered]

    def named(self, where: Site) -> tuple[str, str | None]:
        """A read's site for display, ``file.py:LINE``, and its ``via`` (None: the script's own
        read), as :meth:`rows` names them."""
        return f"{self._frames.relative(where[0])}:{where[1]}", self._via(where[2])

    def _via(self, via: Where | None) -> str | None:
        return None if via is None else f"{self._frames.relative(via[0])}:{via[1]}"

    # -- install and undo ----------------------------------------------------------------------

    def start(self, patches: Patches) -> None:
        """Patch the reads through ``patches`` (whose ``undo()`` takes them away, with the sync
        debug mode and its warning hook) and watch CUDA's syncs from when the script starts
        CUDA; initialises nothing. A second call does nothing."""
        if self._started:
            return
        import torch

        self._started = True
        self.thread = threading.get_ident()
        self._frames.know_torch(torch.__file__)
        patch_reads(self, patches)
        patches.call(self._off)
        self.cuda.watch()

    def stop(self) -> None:
        """Count nothing more (the patches stay until their undo, passing every call on)."""
        self.thread = None
        self.cuda.stop()

    def _off(self) -> None:
        self.cuda.off()
        self.thread = self._copy = None

    # -- counting ------------------------------------------------------------------------------

    def seen(self, call: str, tensor: Any, frame: FrameType) -> None:
        """A read (``call``, of ``tensor`` if known) of the script's thread is about to run,
        called from ``frame``: count it (off CUDA), or keep it for CUDA's warning to name."""
        if self.loading:
            return
        if call == "Tensor.__repr__" and self._str == (id(frame), frame.f_lasti):
            self._str = None
            return  # str(x) calls repr(x)
        self._str = (id(frame), frame.f_lasti) if call == "Tensor.__str__" else None
        if self.cuda.on:
            self.cuda.pend(call, frame)
            return
        where = self._frames.where(frame, through_torch=False)
        if where is None:
            return
        copy, self._copy = self._copy, None
        if copy is not None and copy == (id(frame), where) and call not in _COPIES:
            return  # x.cpu().numpy(): one read
        if tensor is not None and self._frames.host_only(frame.f_code, tensor):
            return
        if call in _COPIES:
            self._copy = (id(frame), where)
        self.add(where, call)

    def add(self, where: Site, call: str) -> None:
        """Count one read by ``call`` at ``where``, in the open step or outside steps, once
        ``on_read`` heard of it."""
        if self.on_read is not None:
            self.on_read(call, where)
        if self._in_step:
            part, key = self._part, (where[0], where[1], call, True, where[2])
            part[key] = part.get(key, 0) + 1
        else:
            counts, key = self._counts, (where[0], where[1], call, False, where[2])
            counts[key] = counts.get(key, 0) + 1
