"""Patches the runner puts on torch and the frameworks, each undone at exit, in reverse order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Patches"]


class Patches:
    """Attributes replaced and hook handles taken; :meth:`undo` restores them all (idempotent)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Set ``owner.name`` to ``make(original)``; undo puts the original back."""
        # the class's own attribute, not one inherited: undo must not shadow a base's
        had = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))

        def restore() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(restore)

    def handle(self, handle: Any) -> None:
        """Keep a hook's handle (``handle.remove()`` at undo)."""
        self._undo.append(handle.remove)

    def call(self, function: Callable[[], None]) -> None:
        """Call ``function`` at undo."""
        self._undo.append(function)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()
