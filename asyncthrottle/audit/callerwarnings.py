"""Warnings raised inside the runner's wrappers, issued at the line of the script that called the
wrapper, as without the runner.

A wrapper written in Python (``torch.nonzero``'s, indexing's) is a frame between the script and
torch: a warning torch raises in it (C++ warnings name the innermost Python frame) is the
wrapper's, by its file, line and module, so the script's ``filterwarnings(..., module=...)``
misses it and the wrong line is shown. One filter, kept first in ``warnings.filters``, catches a
warning raised in a frame of the wrappers' module and issues it again with
``warnings.warn_explicit`` at the frame that called the wrapper: its file, line, module and
registry, as Python takes them from the frame a warning is raised in; where it was raised, it is
ignored. The filter matches nothing else, so it changes no other warning (and no registry).
"""

from __future__ import annotations

import sys
import threading
import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .patches import Patches

__all__ = ["CallerWarnings"]

_get_ident = threading.get_ident


class CallerWarnings:
    """The filter for the wrappers of module ``module`` (its ``__name__``): :meth:`start` puts it
    first in ``warnings.filters`` (the patches' undo takes it away), :meth:`front` puts it back
    first where the script's own filters have gone before it (call it in each wrapper, before
    the call that may warn).

    ``warnings`` matches a filter's message and module with the ``match()`` of the objects in
    those places and tests the category with ``issubclass``: this filter's three objects take
    the warning's text, module and category (see :meth:`given`)."""

    def __init__(self, module: str) -> None:
        self.module = module
        # per thread: what the filter's objects were given so far of the warning being filtered
        self._given: dict[int, dict[str, Any]] = {}
        self.entry = ("ignore", _Given(self, "text"), _Category(self), _Given(self, "module"), 0)
        self._on = False

    def start(self, patches: Patches) -> None:
        """Put the filter first in ``warnings.filters``, until ``patches.undo()``."""
        self._on = True
        self.front()
        patches.call(self._stop)

    def front(self) -> None:
        """The filter first in ``warnings.filters`` again (after :meth:`start`, before undo)."""
        filters = _filters()
        if not self._on or (filters and filters[0] is self.entry):
            return
        _remove(filters, self.entry)
        filters.insert(0, self.entry)

    def _stop(self) -> None:
        self._on = False
        _remove(_filters(), self.entry)

    def given(self, name: str, value: Any) -> bool:
        """One of the warning's text, module and category, given to the filter's objects in
        an order of the warnings module's: the last of the three decides whether the filter
        matches (True: it was raised in a wrapper and is issued again at its caller); the others
        match, so that it is asked."""
        ident = _get_ident()
        given = self._given.setdefault(ident, {})
        given[name] = value
        if len(given) < 3:
            return True
        del self._given[ident]
        return given["module"] == self.module and self._again(given["text"], given["category"])

    def _again(self, text: str, category: type[Warning]) -> bool:
        """The warning issued again at the caller of the wrapper it was raised in (an ``error``
        filter raises it from here, into torch's call, as it would have been raised there);
        False: no wrapper's frame is on the stack."""
        caller = _caller(self.module)
        if caller is None:
            return False
        where = caller.f_globals
        registry = where.get("__warningregistry__")
        if not isinstance(registry, dict):
            registry = where["__warningregistry__"] = {}
        module = where.get("__name__")
        warnings.warn_explicit(text, category, caller.f_code.co_filename, caller.f_lineno,
                               module=module if isinstance(module, str) else "<string>",
                               registry=registry)
        return True


def _caller(module: str) -> FrameType | None:
    """The frame that called the innermost frame of ``module`` on this thread's stack (None:
    no frame of ``module`` is on it)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") != module:
        frame = frame.f_back
    return frame.f_back if frame is not None else None


def _filters() -> list[Any]:
    """``warnings.filters``: the list the warnings module reads now (``catch_warnings()`` puts
    another in its place)."""
    return cast("list[Any]", warnings.filters)


def _remove(filters: list[Any], entry: tuple[Any, ...]) -> None:
    """``entry`` out of ``filters`` (by identity), wherever it is."""
    for k, item in enumerate(filters):
        if item is entry:
            del filters[k]
            return


class _Given:
    """The filter's message or module: ``match()`` gives it to the filter."""

    def __init__(self, owner: CallerWarnings, name: str) -> None:
        self._owner, self._name = owner, name
        self.pattern = owner.module if name == "module" else ""

    def match(self, value: str) -> bool:
        return self._owner.given(self._name, value)

    def __repr__(self) -> str:
        return (f"<module {self.pattern}: issued again at its caller>" if self.pattern
                else "<any message>")


class _Category:
    """The filter's category: ``issubclass(category, this)`` gives it to the filter."""

    def __init__(self, owner: CallerWarnings) -> None:
        self._owner = owner

    def __subclasscheck__(self, category: type[Warning]) -> bool:
        return self._owner.given("category", category)

    def __repr__(self) -> str:
        return "<any warning>"
