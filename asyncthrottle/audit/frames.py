"""Which file a frame is (the script's, torch's, a package's, ours) and where a read counts."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Any

from ..parts.syncaudit import short_path

__all__ = ["TORCH", "Frames", "Kind", "Site", "Where"]

# what a frame's file is: the standard library's, torch's, this library's, the runner's and the
# audit's (which run the script's reads and call none of its code back), an installed package's (its
# path in a 1-tuple), else the script's path
_STDLIB, TORCH, _OURS, _RUNS = 0, 1, 2, 3
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNNER = tuple(os.path.join(_PACKAGE, room) + os.sep for room in ("audit", "run"))
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_SITE_DIRS = tuple(os.sep + name + os.sep for name in ("site-packages", "dist-packages"))
# a function naming one of these builds tensors from host data (a logger's torch.tensor(deque))...
_HOST_BUILDERS = frozenset(("tensor", "as_tensor", "from_numpy"))
# ...unless it also names a device (.to(), .cuda(), device=) or trains (a loop's backward())
_DEVICE_NAMES = frozenset(("to", "cuda", "device", "backward"))

Where = tuple[str, int]
# where a read is counted: the script's path and line, and the installed package's frame it was
# made in (None: the script's own read)
Site = tuple[str, int, Where | None]
Kind = int | str | tuple[str]


class Frames:
    """The script's frames, told from the standard library's, torch's, an installed package's (a
    file below a ``site-packages`` or ``dist-packages`` folder that is not below ``roots``),
    this library's and the runner's; each file's kind is learnt once.

    A read counts at the script's frame (:meth:`where`), ``via`` the installed package's
    innermost frame it passed; a read of this library (or of what it calls) is none.
    """

    def __init__(self, roots: Sequence[str]) -> None:
        """Args:
            roots: the script's folders (its sites are named relative to them).
        """
        if isinstance(roots, (str, bytes)) or not all(isinstance(r, str) for r in roots):
            raise TypeError(f"roots must be a list of folder paths (str), got {roots!r}: pass "
                            f"[{roots!r}] for one folder")
        self._roots = sorted((os.path.abspath(r).rstrip(os.sep) + os.sep for r in roots),
                             key=len, reverse=True)
        self._kinds: dict[str, Kind] = {}
        self._hosts: dict[CodeType, bool] = {}
        # no path starts with a NUL: no file is torch's until know_torch()
        self._torch_dir = "\0"

    def know_torch(self, torch_file: str) -> None:
        """Torch's files are those below the folder of ``torch_file`` (``torch.__file__``)."""
        self._torch_dir = os.path.dirname(os.path.abspath(torch_file)) + os.sep

    def relative(self, path: str) -> str:
        """``path`` for display: relative to the longest root that holds it, else to its
        ``sys.path`` entry (an installed package's, even in the script's folder)."""
        if path.startswith("<"):
            return path
        if not self._installed(path):  # a package in the script's .venv: from its sys.path entry
            for root in self._roots:
                if path.startswith(root):
                    return path[len(root):]
        return short_path(path)

    def kind_of(self, name: str) -> Kind:
        """The kind of the file named ``name`` (a code object's ``co_filename``): :data:`TORCH`,
        another int for the standard library, this library or the runner, a 1-tuple of an
        installed package's path, else the script's path (a str)."""
        kind = self._kinds.get(name)
        if kind is None:
            kind = self._kinds[name] = self._kind(name)
        return kind

    def caller(self, frame: FrameType | None) -> FrameType | None:
        """The innermost frame outside the standard library and torch."""
        while frame is not None and self.kind_of(frame.f_code.co_filename) in (_STDLIB, TORCH):
            frame = frame.f_back
        return frame

    def where(self, frame: FrameType | None, *, through_torch: bool) -> Site | None:
        """The script's frame and line from ``frame`` outwards, with the innermost installed
        package's frame passed on the way (``via``); the package's frame itself where no script
        frame is outside it; None for a read of torch's own code (unless ``through_torch``) or
        of this library's, or (unless ``through_torch``) of a package this library called."""
        via: Where | None = None
        while frame is not None:
            kind = self.kind_of(frame.f_code.co_filename)
            if isinstance(kind, str):
                if not through_torch and self._called_by_us(frame):
                    return None  # the library's callback (on_complete): its values are host copies
                return kind, frame.f_lineno, via
            if kind == _STDLIB or (kind == TORCH and through_torch) or (
                    via is not None and kind in (TORCH, _RUNS)):
                frame = frame.f_back  # past a package, torch's frames and the runner's wrappers too
            elif isinstance(kind, tuple):
                via = via or (kind[0], frame.f_lineno)
                frame = frame.f_back
            else:  # this library's code (or, with no package passed, torch's or the runner's)
                return None if via is None or not through_torch else (*via, None)
        return None if via is None else (*via, None)

    def host_only(self, code: CodeType, tensor: Any) -> bool:
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

    def _called_by_us(self, frame: FrameType) -> bool:
        back = frame.f_back
        return back is not None and self.kind_of(back.f_code.co_filename) == _OURS

    def _kind(self, name: str) -> Kind:
        if name.startswith("<frozen "):
            return _STDLIB
        if name.startswith("<"):
            return name
        path = os.path.abspath(name)
        if path.startswith(self._torch_dir):
            return TORCH
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
