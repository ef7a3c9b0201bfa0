"""The names a line's values are computed from, in its function: the line's own names and, for
each local the function assigns, the names of what it assigns (read once per function, by AST);
and whether any of those builds a tensor from host data (``torch.tensor(values)``)."""

from __future__ import annotations

import ast
import linecache
from types import CodeType

__all__ = ["Found", "Sources"]

# a function's flow, once read: the names each statement (by its first and last line) loads,
# what each name the function assigns is assigned from, and the function's arguments; a name
# of _BUILT stands for a call that builds a tensor on the host
_Flow = tuple[list[tuple[int, int, frozenset[str]]], dict[str, set[str]], frozenset[str]]
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_BUILT = "<built on the host>"
# the calls that build a tensor from host data, unless given device= (torch.tensor, tensor)
_BUILDS = frozenset(("tensor", "as_tensor", "asarray", "from_numpy"))
# what Sources.at() gives: the names, those the function assigns, whether one is built here
Found = tuple[frozenset[str], frozenset[str], bool]


class Sources:
    """Per code object and line, the names whose values the line computes from (flow-insensitive:
    every assignment of a local in the function counts), and which of them the function
    assigns itself; None where the source cannot be read (``exec``'d code)."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module | None] = {}
        self._flows: dict[CodeType, _Flow | None] = {}
        self._known: dict[tuple[CodeType, int], Found | None] = {}

    def at(self, code: CodeType, line: int) -> Found | None:
        """The names line ``line`` of ``code`` computes from (its own and, through the locals
        it assigns, theirs), the subset ``code`` assigns (its arguments excepted), and whether
        the line or an assignment it computes from builds a tensor from host data."""
        key = (code, line)
        if key not in self._known:
            flow = self._flow(code)
            self._known[key] = None if flow is None else _closure(flow, line)
        return self._known[key]

    def _flow(self, code: CodeType) -> _Flow | None:
        if code not in self._flows:
            tree = self._tree(code.co_filename)
            scope = None if tree is None else _scope(tree, code)
            self._flows[code] = None if scope is None else _read(scope)
        return self._flows[code]

    def _tree(self, filename: str) -> ast.Module | None:
        if filename not in self._trees:
            try:
                self._trees[filename] = ast.parse("".join(linecache.getlines(filename)) or "\0")
            except (SyntaxError, ValueError):
                self._trees[filename] = None
        return self._trees[filename]


def _scope(tree: ast.Module, code: CodeType) -> ast.AST | None:
    """The function (or lambda) ``code`` was compiled from; for a comprehension's code, the
    innermost function around its line; the module for its top level."""
    if code.co_name == "<module>":
        return tree
    line, found = code.co_firstlineno, None
    for node in ast.walk(tree):
        if not isinstance(node, _SCOPES):
            continue
        # a decorated function's code starts at its first decorator
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        if first <= line <= (node.end_lineno or line):
            if first == line and getattr(node, "name", "<lambda>") == code.co_name:
                return node
            if found is None or node.lineno >= found.lineno:
                found = node
    return found


def _read(scope: ast.AST) -> _Flow:
    statements: list[tuple[int, int, frozenset[str]]] = []
    defs: dict[str, set[str]] = {}
    if isinstance(scope, ast.Lambda):  # its body: one expression, as one statement
        statements.append((scope.lineno, scope.end_lineno or scope.lineno,
                           frozenset(_loads(scope.body))))
    for node in _own_nodes(scope):
        if isinstance(node, ast.stmt):
            heads = _heads(node)
            loaded = frozenset(name for h in heads for name in _loads(h))
            statements.append((node.lineno, node.end_lineno or node.lineno, loaded))
        for target, value in _assignments(node):
            names = set(_loads(value))
            for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                defs.setdefault(name, set()).update(names)
    args = getattr(scope, "args", None)
    arguments = frozenset() if args is None else frozenset(
        a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
        if a is not None)
    return statements, defs, arguments


def _loads(node: ast.AST) -> list[str]:
    """The names ``node`` loads, and :data:`_BUILT` where it builds a tensor from host data."""
    out = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            out.append(sub.id)
        elif isinstance(sub, ast.Call) and _called(sub.func) in _BUILDS and not any(
                k.arg == "device" for k in sub.keywords):
            out.append(_BUILT)
    return out


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of ``scope``'s body, not of the functions and classes defined in it."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (*_SCOPES, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _heads(node: ast.stmt) -> list[ast.AST]:
    """What a statement itself evaluates: a compound statement's header, else all of it."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [item.context_expr for item in node.items]
    if isinstance(node, (ast.Try, *_SCOPES, ast.ClassDef)):
        return []
    return [node]


def _assignments(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """The (target, value) pairs a node binds: ``=``, ``+=``, ``for``, ``with ... as``, ``:=``."""
    if isinstance(node, ast.Assign):
        return [(target, node.value) for target in node.targets]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return [(node.target, node.value), *([(node.target, node.target)]
                                             if isinstance(node, ast.AugAssign) else [])]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, node.context_expr)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    return []


def _closure(flow: _Flow, line: int) -> Found | None:
    statements, defs, arguments = flow
    around = [s for s in statements if s[0] <= line <= s[1]]
    if not around:
        return None
    # the innermost statement: the one that starts last
    names = set(max(around, key=lambda s: (s[0], -s[1]))[2])
    todo = [n for n in names if n in defs]
    while todo:
        for name in defs[todo.pop()]:
            if name not in names:
                names.add(name)
                if name in defs:
                    todo.append(name)
    built = _BUILT in names
    names.discard(_BUILT)
    return (frozenset(names), frozenset(n for n in names if n in defs and n not in arguments),
            built)
