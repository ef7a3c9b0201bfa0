"""The receivers of a sync site's read: the expressions its line reads, found by ``ast``."""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Iterator
from typing import Any

from .sourceindex import Index, index

__all__ = ["read_targets", "receivers"]

# the calls that make a read of their first argument, by the read (``float(x)``: ``__float__``)
_BUILTINS = {"__float__": ("float",), "__int__": ("int",), "__index__": ("int", "range"),
             "__bool__": ("bool",), "__str__": ("str", "print"), "__repr__": ("repr",),
             "__format__": ("format",), "print": ("print",),
             "__array__": ("asarray", "array", "np.asarray", "np.array", "numpy.asarray",
                           "numpy.array")}


def receivers(row: dict[str, Any], call: str) -> list[str]:
    """The expressions the site's line reads with ``call``, as written (``output.mean()`` in
    ``output.mean().item()``; each of ``a.item() + b.item()``), from the site's file; a regex
    on the line where the file does not parse; else ``["the value"]``."""
    path, _, number = row["site"].rpartition(":")
    file = row.get("file") or path
    line = int(number) if number.isdigit() else 0
    # the file as it is now, not as the script's traceback (or an earlier report) read it
    found = _parsed(index(file), line, call, row.get("fields") or [])
    if not found:
        fallback = _matched(linecache.getline(file, line), call)
        found = [fallback] if fallback else []
    return found or ["the value"]


def _parsed(source: Index, line: int, call: str, fields: list[int]) -> list[str]:
    """The receivers ``ast`` finds on ``line`` of the file (the reads that start on it, else the
    innermost that span it), left to right; of an f-string's, the ``fields`` (positions among
    the line's, as the audit saw them formatted) where they are known. The file's index gives
    the line's nodes: no walk of its tree a site."""
    hits = [(read, target) for node in source.reads(line)
            for read, target in read_targets(node, call) if _spans(read, line)]
    starting = [hit for hit in hits if hit[0].lineno == line]
    if not starting and hits:
        span = min(_span(read) for read, _ in hits)
        starting = [hit for hit in hits if _span(hit[0]) == span]
    starting.sort(key=lambda hit: (hit[0].lineno, hit[0].col_offset))
    if fields:
        values = sorted((hit for hit in starting if isinstance(hit[0], ast.FormattedValue)),
                        key=lambda hit: (hit[1].lineno, hit[1].col_offset))
        if max(fields) < len(values):
            starting = [values[k] for k in fields]
    names: list[str] = []
    for _, target in starting:
        name = ast.unparse(target)
        if name not in names:
            names.append(name)
    return names


def _spans(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    return start is not None and start <= line <= (getattr(node, "end_lineno", None) or start)


def _span(node: ast.expr | ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno


def read_targets(node: ast.AST, call: str) -> Iterator[tuple[ast.expr | ast.stmt, ast.expr]]:
    """The reads ``node`` makes with ``call``: each read's own node and what it reads."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == call:
            # torch.nonzero(x): the function form reads its argument, not torch
            module = isinstance(func.value, ast.Name) and func.value.id in ("torch", "Tensor")
            if module and node.args:
                yield node, node.args[0]
            elif not module:
                yield node, func.value
        elif node.args and ast.unparse(func) in _BUILTINS.get(call, ()):
            yield node, node.args[0]
    elif call == "__format__" and isinstance(node, ast.FormattedValue):
        yield node, node.value
    elif call == "__bool__" and isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        yield node.test, node.test
    elif call == "__getitem__" and isinstance(node, ast.Subscript) and not isinstance(
            node.slice, (ast.Constant, ast.Slice, ast.Tuple)):
        yield node, node.value


def _matched(source: str, call: str) -> str | None:
    """The receiver a regex finds on the line's ``source`` (the line of a file that does not
    parse)."""
    found = re.search(r"([A-Za-z_][\w.]*)\." + re.escape(call) + r"\(", source)
    if found is None and call == "__bool__":
        found = re.search(r"\b(?:if|while|elif)\s+(.+?)\s*:", source)
    if found is None and call.startswith("__"):
        found = re.search(r"(?:float|int|bool|print|str|repr)\(\s*([A-Za-z_][\w.]*)", source)
    return found.group(1) if found else None
