"""The script's host reads of device values by line: CUDA's sync warnings, or (elsewhere) the reads
that would sync on an accelerator."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from .blocked import ReadTimer
from .cudasyncs import CUDA_SYNC, CudaSyncs
from .frames import Frames, Site, Where
from .fstrings import Fields
from .homes import Homes
from .reads import patch_reads

if TYPE_CHECKING:
    from .patches import Patches

__all__ = ["CUDA_SYNC", "SyncSites"]

_COPIES = ("Tensor.cpu", "Tensor.to")
# a count's key: path, line, call, in a step, via
Key = tuple[str, int, str, bool, Where | None]
# what is known of a key's reads: [how many, how many were timed, the nanoseconds those blocked]
Count = list[int]
# where a timed read's nanoseconds go: its count, and the step state it was counted in
Filed = tuple[Count, int]

_getprofile = sys.getprofile


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
    that would live on the host (:class:`~asyncthrottle.audit.homes.Homes`): one built from
    Python or NumPy data with no device (a logger's ``torch.tensor(list(deque)).median().item()``,
    a schedule's tensor of fractions read in a closure), or computed only from such tensors;
    whatever has autograd history, is a parameter or a module's buffer, or was moved or made on
    a device counts. ``to()`` counts only from a device tensor.

    Only the thread that called ``start()`` (the script's) is counted: a read on another thread
    (a prefetch thread's ``cpu()``) blocks that thread, not the loop, and is neither in a step
    nor outside one; the input wait tells of a slow producer.

    Each counted read is timed: the wall time the script's thread spent in it, on CUDA the
    sync's wait (a row's ``blocked_s``). A method read is timed by a profile function installed
    at its lookup and removed as its call ends (:class:`~asyncthrottle.audit.blocked.ReadTimer`:
    not while another profile function is installed, a profiler's, nor while torch's profiler
    runs), a read function by the runner's wrapper around it. A read inside a timed read is
    part of it; a read whose step opened or closed while it ran, and a ``CUDA sync``, are not
    timed.

    Attributes:
        loading: set by the caller: True while the DataLoader fetches a batch.
        thread: the id of the thread counted (the script's, from ``start()``; None: none).
        cuda: CUDA's side (``cuda.on`` once the script started CUDA).
        on_read: told of each read before it is counted, ``on_read(call, where)`` (None: none);
            what it raises leaves the read uncounted and reaches the script's line
            (:func:`asyncthrottle.testing.forbid_syncs` raises there).
    """

    def __init__(self, roots: Sequence[str], *, cuda: Any = None,
                 on_read: Callable[[str, Site], None] | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        """Args:
            roots: the script's folders (its sites are named relative to them).
            cuda: ``torch.cuda`` (None) or a stand-in with its ``_lazy_call`` and sync debug mode.
            on_read: see the attribute.
            clock: nanoseconds, for the time blocked in reads (``time.perf_counter_ns``).
        """
        self.on_read = on_read
        self._frames = Frames(roots)
        # the f-string fields each line's Tensor.__format__ reads formatted (by path and line)
        self._fields = Fields()
        self._formatted: dict[tuple[str, int], set[int]] = {}
        self.loading = False
        self._in_step = self._marked = self._merged = False
        self._counts: dict[Key, Count] = {}
        # the open (or last) step's reads: the part before mark_tail() and the one after it
        self._parts: list[dict[Key, Count]] = [{}]
        self._part = self._parts[0]
        # each change of the step state (a read timed across one is not filed)
        self._state = 0
        # the read counted last, and the one being timed (None on CUDA until it synced)
        self._last: Filed | None = None
        self._timed: Filed | None = None
        self._timing = False
        # on CUDA, the nanoseconds of a read C called at once (float(loss)), whose end was
        # heard before its sync's warning (it comes as torch's binding returns): the next add()'s
        self._unfiled: tuple[int, int] | None = None
        self.clock = clock
        self.timer = ReadTimer(self.blocked, clock)
        self.thread: int | None = None
        self._started = False
        self._copy: tuple[int, Site] | None = None
        self._str: tuple[int, int] | None = None
        self.cuda = CudaSyncs(self, self._frames, cuda)
        self.homes = Homes(self._frames)
        # the code of torch's read methods written in Python (a read inside one is part of it)
        self.nested: frozenset[CodeType] = frozenset()

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
        self._state += 1
        if value:
            self._part = {}
            self._parts = [self._part]
            self._marked = self._merged = False
        elif any(self._parts):
            # (a step with no read: no call, every step)
            self._merge(1)
        else:
            self._merged = True

    def discard_step(self) -> None:
        """The step opened last was none: its reads (so far) are outside steps."""
        if self._merged:
            self._merge(-1)
        for part in self._parts:
            _fold(self._counts, {(path, line, call, False, via): count
                                 for (path, line, call, _, via), count in part.items()})
        self._part = {}
        self._parts = [self._part]
        self._marked = False
        self._state += 1

    def mark_tail(self) -> None:
        """The open step's tail starts: :meth:`tail_rows` gives its reads from now on."""
        self._part = {}
        self._parts.append(self._part)
        self._marked = True
        self._state += 1

    def tail_rows(self) -> list[dict[str, Any]]:
        """The rows of the reads in the step since :meth:`mark_tail` (none before a mark in the
        step opened last), ``per_step`` their count."""
        return self._format(self._part, 1) if self._marked else []

    def _merge(self, sign: int) -> None:
        for part in self._parts:
            if part:
                _fold(self._counts, part, sign)
        self._merged = sign > 0

    # -- the report ----------------------------------------------------------------------------

    def rows(self, steps: int) -> list[dict[str, Any]]:
        """One row per site, call, in/out of steps and ``via``, the most frequent first;
        ``per_step`` is ``count / steps`` (0.0 for 0 steps); ``via``: the installed package's
        ``file.py:LINE`` that made the read, or None for the script's own; ``file``: the
        site's absolute path (``site`` is for display); ``blocked_s``: the seconds its timed
        reads blocked (None: none was timed), ``blocked_per_step_s`` that over ``steps`` (None
        for 0 steps)."""
        counts = dict(self._counts)
        if self._in_step:
            for part in self._parts:
                _fold(counts, part)
        return self._format(counts, steps)

    def _format(self, counts: dict[Key, Count], steps: int) -> list[dict[str, Any]]:
        ordered = sorted(counts.items(), key=lambda item: (
            -item[1][0], self._frames.relative(item[0][0]), item[0][1], item[0][2],
            not item[0][3], self._via(item[0][4]) or ""))
        rows = []
        for (path, line, call, in_step, via), (count, timed, ns) in ordered:
            blocked = ns / 1e9 if timed else None
            rows.append({
                "site": f"{self._frames.relative(path)}:{line}", "call": call, "count": count,
                "per_step": count / steps if steps > 0 else 0.0, "in_step": in_step,
                "via": self._via(via), "file": path, "blocked_s": blocked,
                "blocked_per_step_s": blocked / steps if blocked is not None and steps > 0
                else None})
            fields = self._formatted.get((path, line)) if call == "Tensor.__format__" else None
            if fields:
                rows[-1]["fields"] = sorted(fields)
        return rows

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
        self.homes.install(patches)
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

    def seen(self, call: str, tensor: Any, frame: FrameType) -> bool:
        """A read (``call``, of ``tensor`` if known) of the script's thread is about to run,
        called from ``frame``: count it (off CUDA), or keep it for CUDA's warning to name.
        True: it was counted, or is kept (the caller times it: :meth:`timing`)."""
        if self.loading:
            return False
        if call == "Tensor.__repr__" and self._str == (id(frame), frame.f_lasti):
            self._str = None
            return False  # str(x) calls repr(x)
        self._str = (id(frame), frame.f_lasti) if call == "Tensor.__str__" else None
        if self.cuda.on:
            self._unfiled = None
            return self.cuda.pend(call, frame)
        copy, self._copy = self._copy, None
        if tensor is not None and not self.homes.on_device(tensor, frame):
            return False
        where = self._frames.where(frame, cuda=False, nested=self.nested)
        if where is None:
            return False
        if copy is not None and copy == (id(frame), where) and call not in _COPIES:
            return False  # x.cpu().numpy(): one read
        if call in _COPIES:
            self._copy = (id(frame), where)
        self.add(where, call)
        if call == "Tensor.__format__" and isinstance(
                self._frames.kind_of(frame.f_code.co_filename), str):
            # the script's own f-string: which of the line's fields (the report names that one)
            field = self._fields.at(frame)
            if field is not None:
                self._formatted.setdefault((where[0], where[1]), set()).add(field)
        return True

    def add(self, where: Site, call: str) -> None:
        """Count one read by ``call`` at ``where``, in the open step or outside steps, once
        ``on_read`` heard of it; the read being timed (on CUDA: its first sync) is filed
        here."""
        if self.on_read is not None:
            self.on_read(call, where)
        in_step = self._in_step
        counts = self._part if in_step else self._counts
        key = (where[0], where[1], call, in_step, where[2])
        count = counts.get(key)
        if count is None:
            count = counts[key] = [0, 0, 0]
        count[0] += 1
        unfiled, self._unfiled = self._unfiled, None
        if call != CUDA_SYNC:
            self._last = (count, self._state)
            if self._timing and self._timed is None:
                self._timed = self._last
            elif unfiled is not None and unfiled[1] == self._state:
                count[1] += 1
                count[2] += unfiled[0]

    # -- the time blocked ----------------------------------------------------------------------

    def timing(self) -> bool:
        """The read just seen (:meth:`seen` said True) is to be timed: True when no other read
        is (one that may end, ends: see :meth:`ReadTimer.release`); :meth:`blocked` follows."""
        if self._timing and not self.timer.release():
            return False
        self._timing, self._unfiled = True, None
        self._timed = None if self.cuda.on else self._last
        return True

    def time_read(self, bound: Any, frame: FrameType) -> bool:
        """Time the read just seen whose method ``bound`` the script's ``frame`` looked up, when
        no profile function but the timer's is installed (a script under ``cProfile`` keeps its
        own) and torch's profiler is off (its Python tracer is one too). True: the caller
        installs ``self.timer.profile`` (``sys.setprofile``)."""
        timer = self.timer
        installed = _getprofile()
        if (installed is None or installed is timer.profile) and not timer.profiling() and (
                self.timing()):
            return timer.arm(bound, frame)
        return False

    def blocked(self, ns: int | None) -> None:
        """The read timed ended, having blocked ``ns`` nanoseconds (None: not timed): filed
        where it was counted, unless the step opened or closed since."""
        filed, self._timed, self._timing = self._timed, None, False
        if ns is None:
            return
        if filed is not None:
            if filed[1] == self._state:
                filed[0][1] += 1
                filed[0][2] += ns
        elif self.cuda.on:
            self._unfiled = (ns, self._state)


def _fold(into: dict[Key, Count], counts: dict[Key, Count], sign: int = 1) -> None:
    """Add ``counts`` (``sign`` -1: take them away) to ``into``, whose lists stay as they were
    (a copy of ``into`` shares them); a key of no read leaves."""
    for key, (count, timed, ns) in counts.items():
        had = into.get(key, (0, 0, 0))
        total = [had[0] + sign * count, had[1] + sign * timed, had[2] + sign * ns]
        if total[0]:
            into[key] = total
        else:
            into.pop(key, None)
