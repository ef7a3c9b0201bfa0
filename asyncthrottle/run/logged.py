"""Whether a collective's result is only logged, found by ``ast`` in the script (a detached
loss ``all_reduce``d each step for a print or a logger)."""

from __future__ import annotations

import ast
import linecache

from .scriptast import ancestors

__all__ = ["only_logged"]

# the calls that log what they are given: print, a logger's, a writer's, a progress bar's
_LOGS = frozenset(("print", "debug", "info", "warning", "warn", "error", "critical", "log",
                   "add_scalar", "add_scalars", "log_metrics", "log_dict", "set_postfix",
                   "set_description", "write"))
# how far a value is followed through names assigned from it (``avg = t.item() / world``)
_DEPTH = 3


def only_logged(file: str, line: int, call: str) -> bool:
    """Whether the ``call`` on ``line`` of ``file`` (``dist.all_reduce(t)``) runs in a loop whose
    every later read of its tensor (its first argument, a name) is in the arguments of a logging
    call (:data:`_LOGS`), directly or through names assigned from it. False where the file does
    not parse, the call is not found, is in no loop, or its result is never read."""
    linecache.checkcache(file)
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return False
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == line and _named(node.func) == call:
            loop = next((a for a in ancestors(node, parent, None)
                         if isinstance(a, (ast.For, ast.While))), None)
            if loop is not None and node.args and isinstance(node.args[0], ast.Name):
                return _logged(node.args[0].id, loop, node, parent, _DEPTH)
    return False


def _named(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _logged(name: str, loop: ast.AST, skip: ast.AST, parent: dict[ast.AST, ast.AST],
            depth: int) -> bool:
    """Whether every read of ``name`` in ``loop`` (outside ``skip``) is logged; False where none
    is."""
    reads = [node for node in ast.walk(loop) if isinstance(node, ast.Name) and node.id == name
             and isinstance(node.ctx, ast.Load) and skip not in ancestors(node, parent, loop)]
    return bool(reads) and all(_read_logged(read, loop, parent, depth) for read in reads)


def _read_logged(read: ast.Name, loop: ast.AST, parent: dict[ast.AST, ast.AST],
                 depth: int) -> bool:
    for above in ancestors(read, parent, loop):
        if isinstance(above, ast.Call) and _named(above.func) in _LOGS:
            return True
        if isinstance(above, ast.stmt):
            return (depth > 0 and isinstance(above, ast.Assign) and len(above.targets) == 1
                    and isinstance(above.targets[0], ast.Name)
                    and _logged(above.targets[0].id, loop, above, parent, depth - 1))
    return False
