"""What a script's syntax tree says of its names, for :mod:`.rewrite`: what a statement binds or
changes in place, the name an expression starts from or a NaN/Inf test looks at, a loop's own
nodes and exits, where a loop's body changes each name, a node's ancestors and source text."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence

__all__ = ["ancestors", "binds", "changed", "checked", "exits", "inside", "names", "own", "plain",
           "root", "segment", "tested", "touches"]


def checked(test: ast.expr) -> str | None:
    """The name a NaN/Inf test looks at (``loss`` of ``not torch.isfinite(loss).all()``), or
    None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return tested(test.operand, ("isfinite",), "all")
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        names = {tested(value, ("isnan", "isinf"), "any") for value in test.values}
        return names.pop() if len(names) == 1 else None
    return tested(test, ("isnan", "isinf"), "any")


def tested(node: ast.expr, tests: tuple[str, ...], fold: str) -> str | None:
    """The name ``node`` tests with ``torch.TEST(x)``/``x.TEST()``/``math.TEST(x.item())``, folded
    with ``.FOLD()``/``torch.FOLD(...)``, read with ``.item()``."""
    while isinstance(node, ast.Call) and not node.keywords:
        func, args = node.func, node.args
        if isinstance(func, ast.Attribute) and func.attr in ("item", fold) and not args:
            node = func.value
        elif isinstance(func, ast.Attribute) and ast.unparse(func) == f"torch.{fold}" \
                and len(args) == 1:
            node = args[0]
        elif isinstance(func, ast.Attribute) and func.attr in tests:
            module = ast.unparse(func.value)
            arg = args[0] if module in ("torch", "math") and len(args) == 1 else None
            if module == "math" and isinstance(arg, ast.Call) and not arg.args and isinstance(
                    arg.func, ast.Attribute) and arg.func.attr == "item":
                arg = arg.func.value
            elif module == "math" and isinstance(arg, ast.Call) and ast.unparse(arg.func) \
                    == "float" and len(arg.args) == 1:
                arg = arg.args[0]
            elif module not in ("torch", "math"):
                arg = None if args else func.value
            return arg.id if isinstance(arg, ast.Name) else None
        else:
            return None
    return None


def exits(loop: ast.For) -> tuple[bool, list[ast.stmt]]:
    """Whether ``loop`` may leave by a ``return`` or a ``yield`` of its body, and its own
    ``break`` and ``continue`` statements, the first first."""
    leaves = any(isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom))
                 for node in own(loop.body, loops=False))
    skips: list[ast.stmt] = [node for node in own(loop.body, loops=True)
                             if isinstance(node, (ast.Break, ast.Continue))]
    skips.sort(key=lambda node: (node.lineno, node.col_offset))
    return leaves, skips


def touches(body: Sequence[ast.stmt]) -> dict[str, list[int]]:
    """Each name's places in ``body`` (the positions of its statements) that assign it or change
    it in place, in order: one walk of the body."""
    found: dict[str, list[int]] = {}
    for place, stmt in enumerate(body):
        for node in ast.walk(stmt):
            for name in (*binds(node), changed(node)):
                if name and (not found.get(name) or found[name][-1] != place):
                    found.setdefault(name, []).append(place)
    return found


def segment(lines: Sequence[str], node: ast.expr) -> str:
    """``node``'s source text, as ``ast.get_source_segment`` gives it, from the file's ``lines``
    (no split of the whole source a call)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start, end = node.col_offset, node.end_col_offset
    if first == last:
        return lines[first].encode()[start:end].decode()
    return "".join([lines[first].encode()[start:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:end].decode()])


def binds(node: ast.AST) -> Iterator[str]:
    """The names ``node`` binds: a statement's own (an assignment, a for's target, a with's
    ``as``, a def, an import, a ``global``) or a function's argument; each binding is kept at
    its statement."""
    targets: list[ast.expr] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor,
                           ast.comprehension)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        yield from ((alias.asname or alias.name).split(".")[0] for alias in node.names)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        yield from node.names
    elif isinstance(node, ast.arg):
        yield node.arg
    elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        yield node.name
    for target in targets:
        yield from (name.id for name in names(target))


def changed(node: ast.AST) -> str:
    """The name ``node`` changes in place (``x.add_(1)``, ``x[0] = 1``, ``x.data = y``), or
    ``""``."""
    if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Store):
        target = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr.endswith("_") and not node.func.attr.startswith("_"):
        target = node.func.value
    else:
        return ""
    return target.id if isinstance(target, ast.Name) else ""


def names(node: ast.AST) -> Iterator[ast.Name]:
    return (child for child in ast.walk(node) if isinstance(child, ast.Name))


def root(node: ast.expr) -> str:
    """The name an expression starts from (``x`` of ``x.shape[0]``), or ``""``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def own(body: Sequence[ast.stmt], loops: bool) -> Iterator[ast.AST]:
    """The nodes of ``body`` outside nested functions and classes (and nested loops when
    ``loops``: their ``break`` is their own)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if loops and isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def inside(node: ast.AST, outer: ast.AST, parent: dict[ast.AST, ast.AST]) -> bool:
    return node is outer or any(above is outer for above in ancestors(node, parent, None))


def ancestors(node: ast.AST, parent: dict[ast.AST, ast.AST],
               stop: ast.AST | None) -> Iterator[ast.AST]:
    above = parent.get(node)
    while above is not None and above is not stop:
        yield above
        above = parent.get(above)


def plain(node: ast.AST, name: str, bound: Mapping[str, object]) -> bool:
    """``node`` binds ``name`` to a plain number or string: a constant, ``+=`` a constant,
    ``for NAME in range(...)``, an ``enumerate`` index (``bound``: the script's bound names)."""
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        return len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(
            value, ast.Constant) and isinstance(value.value, (int, float, str))
    if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
            and isinstance(node.iter.func, ast.Name) and node.iter.func.id not in bound:
        target = node.target
        if node.iter.func.id == "range":
            return isinstance(target, ast.Name)
        return node.iter.func.id == "enumerate" and isinstance(target, ast.Tuple) \
            and isinstance(target.elts[0], ast.Name) and target.elts[0].id == name \
            and name not in {n.id for n in names(ast.Tuple(target.elts[1:]))}
    return False
