"""The receivers of a sync site's read: the expressions its line reads, found by ``ast``."""

from __future__ import annotations

import ast
import functools
import linecache
import re
from collections.abc import Iterator
from typing import Any

from .sourceindex import Index, index

__all__ = ["hands_values", "read_targets", "receivers", "str_format", "used"]

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
    file, line = _where(row)
    # the file as it is now, not as the script's traceback (or an earlier report) read it
    found = _parsed(index(file), line, call, row.get("fields") or [])
    if not found:
        fallback = _matched(linecache.getline(file, line), call)
        found = [fallback] if fallback else []
    return found or ["the value"]


# the calls that only log, print or keep a value for logging (a meter's update, a list's append)
_LOGS = frozenset(("print", "log", "info", "debug", "warning", "warn", "error", "write",
                   "add_scalar", "add_scalars", "log_dict", "log_metrics", "set_postfix",
                   "set_description", "append", "extend", "update", "format", "dump", "dumps"))


def used(row: dict[str, Any], call: str) -> bool:
    """Whether the value read at the row's line is used by the script's next lines, not only
    logged: an argument of a call that logs nothing (``envs.step(action.cpu().numpy())``), an
    index, a returned value, or a name assigned from it that is used other than in logging. A
    value only printed, formatted, appended or handed to a logger is not used."""
    file, line = _where(row)
    source = index(file)
    if source.tree is None:
        return False
    flow = _flow(source.tree)
    reads = [read for node in source.reads(line)
             for read, _ in read_targets(node, call) if _spans(read, line)]
    return any(_used(read, flow, set()) for read in reads)


def hands_values(row: dict[str, Any]) -> bool | None:
    """Whether the row's line hands a call anything but constants (``writer.add_scalar("loss",
    loss)``, not ``learn.fit_one_cycle(1)`` nor ``trainer.train()``); None where the line
    cannot be read or parsed."""
    file, line = _where(row)
    source = index(file)
    if source.tree is None or not (source.text(line) or "").strip():
        return None
    calls = [node for node in source.reads(line) if isinstance(node, ast.Call)]
    return any(not isinstance(arg, ast.Constant)
               for call in calls for arg in (*call.args, *(k.value for k in call.keywords)))


def str_format(row: dict[str, Any]) -> bool:
    """Whether the row's line calls ``str.format`` (``fmt.format(**self.__dict__)``)."""
    file, line = _where(row)
    return re.search(r"\.format(_map)?\(", index(file).text(line) or "") is not None


def _where(row: dict[str, Any]) -> tuple[str, int]:
    """The row's file and line (0: none)."""
    path, _, number = row["site"].rpartition(":")
    return row.get("file") or path, int(number) if number.isdigit() else 0


class _Flow:
    """A tree's parents and, by name, the nodes that load it: made in one walk (a report's
    suggestions look many sites of one file up)."""

    def __init__(self, tree: ast.Module) -> None:
        self.parents: dict[ast.AST, ast.AST] = {}
        self.loads: dict[str, list[ast.Name]] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.setdefault(node.id, []).append(node)


@functools.lru_cache(maxsize=4)
def _flow(tree: ast.Module) -> _Flow:
    return _Flow(tree)


def _used(read: ast.AST, flow: _Flow, followed: set[ast.stmt]) -> bool:
    """Whether the value of ``read`` is used beyond logging (see :func:`used`); ``followed``:
    the assignments already followed (``x = x * 2`` reads what it assigns)."""
    node, above = read, flow.parents.get(read)
    while above is not None and not isinstance(above, ast.stmt):
        if isinstance(above, ast.Call) and node is not above.func:
            return _called_name(above.func) not in _LOGS
        if isinstance(above, (ast.JoinedStr, ast.FormattedValue)):
            return False  # formatted: a message
        if isinstance(above, ast.Subscript) and node is above.slice:
            return True  # an index
        node, above = above, flow.parents.get(above)
    if isinstance(above, (ast.Assign, ast.AnnAssign)) and node is above.value:
        if above in followed:
            return False
        followed.add(above)
        targets = above.targets if isinstance(above, ast.Assign) else [above.target]
        names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        scope = _scope(above, flow)
        return any(_scope(load, flow) is scope and _used(load, flow, followed)
                   for name in names for load in flow.loads.get(name, ()))
    return isinstance(above, (ast.If, ast.While, ast.Return, ast.Assert))  # a branch, a result


def _scope(node: ast.AST, flow: _Flow) -> ast.AST | None:
    """The function around ``node`` (None: the module's top level)."""
    above = flow.parents.get(node)
    while above is not None and not isinstance(above, (ast.FunctionDef, ast.AsyncFunctionDef)):
        above = flow.parents.get(above)
    return above


def _called_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else "")


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
