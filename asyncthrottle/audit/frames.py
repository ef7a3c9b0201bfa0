"""Which file a frame is (the script's, torch's, a package's, ours) and where a read counts."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence
from types import CodeType, FrameType

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

    def where(self, frame: FrameType | None, *, cuda: bool,
              nested: frozenset[CodeType] = frozenset()) -> Site | None:
        """The script's frame and line from ``frame`` outwards, past torch's frames, with the
        innermost installed package's frame passed on the way (``via``); the package's frame
        itself where no script frame is outside it. None for a read of this library's code, for
        one inside a torch frame whose code is in ``nested`` (torch's own read method, as
        ``repr`` calling ``item``: that read names it) and, off ``cuda``, for a read of a
        callback or package this library called (``on_complete``: its values are host
        copies)."""
        via: Where | None = None
        torch = False
        while frame is not None:
            kind = self.kind_of(frame.f_code.co_filename)
            if isinstance(kind, str):
                if not cuda and self._called_by_us(frame):
                    return None  # the library's callback (on_complete): its values are host copies
                return kind, frame.f_lineno, via
            if kind == TORCH and frame.f_code in nested:
                return None
            torch = torch or kind == TORCH
            if kind in (_STDLIB, TORCH) or ((via is not None or torch) and kind == _RUNS):
                # past torch's frames, and the runner's wrappers of torch's or a package's code
                # (GradScaler.step): a read the runner's own code makes is none
                frame = frame.f_back
            elif isinstance(kind, tuple):
                via = via or (kind[0], frame.f_lineno)
                frame = frame.f_back
            else:  # this library's code (or, with no package passed, the runner's)
                return None if via is None or not cuda else (*via, None)
        return None if via is None else (*via, None)

    def torch_or_stdlib(self, frame: FrameType) -> bool:
        """Whether ``frame`` runs torch's code or the standard library's."""
        return self.kind_of(frame.f_code.co_filename) in (_STDLIB, TORCH)

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
