"""The tree walk: a function applied to every leaf of a value's mappings, lists, tuples, namedtuples
and dataclasses (deferred values' snapshots, ``to=``'s batches)."""

from __future__ import annotations

import copy
import dataclasses
from collections import UserDict
from collections.abc import Callable, Mapping
from typing import Any

# Types seen to be leaves (not mappings, sequences or dataclasses), at most _KEPT of them.
LEAVES: set[type] = set()
_KEPT = 64


def map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to every leaf of its mappings, lists, tuples, namedtuples and
    dataclasses.

    Containers are rebuilt without running their ``__init__``: a dict
    subclass or a ``UserDict`` (transformers' ``BatchEncoding``) is a shallow
    copy holding the new items, so it keeps its other attributes (a
    ``BatchEncoding``'s encodings, a ``defaultdict``'s factory); a dataclass
    is a shallow copy whose fields are set directly, so ``__post_init__`` does
    not run again (frozen ones and ``InitVar`` fields too). Any other mapping
    keeps its type where the type can be built from a dict; else it becomes a dict.
    """
    kind = type(value)
    # The usual value is one leaf (a loss): its type is known after the first, and no ABC is asked.
    if kind in LEAVES:
        return leaf(value)
    if kind is dict:
        # the other usual value, a dict of metrics: no ABC asked, and no call per known leaf
        # (a loop, not a comprehension: 3.11 makes a comprehension a call)
        mapped: dict[Any, Any] = {}
        for key, item in value.items():
            mapped[key] = leaf(item) if type(item) in LEAVES else map_leaves(item, leaf)
        return mapped
    if isinstance(value, Mapping):
        mapped = {key: map_leaves(item, leaf) for key, item in value.items()}
        return _rebuild_mapping(value, mapped)
    # a namedtuple
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*(map_leaves(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return kind(map_leaves(item, leaf) for item in value)
    # an instance, not the class
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rebuilt = copy.copy(value)
        for field in dataclasses.fields(value):
            # frozen ones too
            object.__setattr__(rebuilt, field.name, map_leaves(getattr(value, field.name), leaf))
        return rebuilt
    if len(LEAVES) < _KEPT:
        LEAVES.add(kind)
    return leaf(value)


def _rebuild_mapping(value: Mapping[Any, Any], mapped: dict[Any, Any]) -> Any:
    """A mapping of ``value``'s type holding ``mapped``, keeping ``value``'s other state where it
    can."""
    try:
        if isinstance(value, UserDict):
            out: Any = copy.copy(value)
            out.data = mapped
            return out
        if isinstance(value, dict):
            out = copy.copy(value)
            dict.clear(out)
            dict.update(out, mapped)
            return out
        return type(value)(mapped)  # type: ignore[call-arg]
    except Exception:
        # a type that cannot be copied or built from a dict
        return mapped
