"""Patches the runner puts on torch and the frameworks, each undone at exit, in reverse order."""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType
from typing import Any

__all__ = ["Patches"]


class Patches:
    """Attributes replaced and hook handles taken; :meth:`undo` restores them all (idempotent)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        # the code of every function put in torch's way: run eagerly, never compiled by Dynamo
        self.codes: list[CodeType] = []

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any], *,
                eager: bool = False) -> None:
        """Set ``owner.name`` to ``make(original)``; undo puts the original back. ``eager``: see
        :meth:`eager`."""
        # the class's own attribute, not one inherited: undo must not shadow a base's
        had = name in vars(owner)
        original = getattr(owner, name)
        # what undo puts back: the class's own attribute as it is, not what looking it up gives
        # (a descriptor put there by another patch -- run's audit under forbid_syncs() -- stays)
        kept = vars(owner)[name] if had else None
        made = make(original)
        if eager:
            self.eager(made)
        setattr(owner, name, made)

        def restore() -> None:
            if had:
                setattr(owner, name, kept)
            else:
                delattr(owner, name)

        self._undo.append(restore)

    def eager(self, function: Any) -> None:
        """Keep ``function``'s code out of Dynamo (see :mod:`asyncthrottle.run.dynamo`): for a
        function torch's own eager code calls (``Tensor.backward`` calls
        ``torch.autograd.backward``), never one Dynamo traces inline (a module's forward hook,
        a read), where a skipped function breaks the graph."""
        code = getattr(function, "__code__", None)
        if isinstance(code, CodeType) and code not in self.codes:
            self.codes.append(code)

    def handle(self, handle: Any) -> None:
        """Keep a hook's handle (``handle.remove()`` at undo)."""
        self._undo.append(handle.remove)

    def call(self, function: Callable[[], None]) -> None:
        """Call ``function`` at undo."""
        self._undo.append(function)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()
