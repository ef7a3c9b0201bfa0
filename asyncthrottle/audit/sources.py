"""The names a line's values are computed from, in its function: the line's own names and, for
each local the function assigns, the names of what it assigns (read once per function, by AST);
whether any of those builds a tensor from host data (``torch.tensor(values)``) or moves one to a
device (``x.to(device)``); which of the function's arguments reach the line as they were handed
in; and, for a closure's free variable, what its enclosing function computes it from."""

from __future__ import annotations

import ast
import linecache
import math
import re
from collections.abc import Iterable, Mapping
from types import CodeType
from typing import NamedTuple

__all__ = ["Found", "Sources"]

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
# names that stand for what a call does rather than for a value: a tensor built on the host, a
# tensor moved (or made) on a device, and (a prefix) an argument's value as handed in
_BUILT = "<built on the host>"
_MOVED = "<moved to a device>"
_HANDED = "<handed in> "
# the calls that build a tensor from host data, unless given device= (torch.tensor, tensor)
_BUILDS = frozenset(("tensor", "as_tensor", "asarray", "from_numpy"))
# to(X) with X one of these (torch.float16, x.dtype, dtype) changes the dtype, not the device
_DTYPES = frozenset((
    "dtype", "float", "float16", "float32", "float64", "half", "double", "bfloat16", "int",
    "int8", "int16", "int32", "int64", "long", "short", "uint8", "bool", "complex64",
    "complex128", "cfloat", "cdouble"))
# a literal CPU device: "cpu", torch.device("cpu")
_CPU = re.compile(r"""(torch\.)?(device\()?["']cpu["']\)?$""")
# the methods that move a tensor: whether their first argument decides (x.to(...)), or not
# (x.cuda() always moves)
_MOVERS = {"to": True, "cuda": False}


class Found(NamedTuple):
    """What a line computes from (see :meth:`Sources.at`)."""

    # the names of the values it computes from
    names: frozenset[str]
    # those the function computes itself (not an argument as handed in, nor a free variable)
    assigned: frozenset[str]
    # a tensor is built from host data in those lines (torch.tensor([...]))
    host: bool
    # a tensor is moved to a device or made there in those lines (x.to(device), device=d)
    device: bool
    # per free variable of a closure: what the enclosing function computes it from
    enclosed: Mapping[str, Found]
    # (an enclosing function's Found) the names that function binds: not visible in the closure
    # unless they are its free variables too
    hidden: frozenset[str]


class _Flow(NamedTuple):
    """A function's flow, once read: the names each statement (by its first and last line)
    loads, what each name it assigns is assigned from, its arguments, the line after which
    each argument's value as handed in no longer reaches (a top-level assignment rebinds it),
    its first line, and what its free variables are computed from in the enclosing functions."""

    statements: list[tuple[int, int, frozenset[str]]]
    defs: dict[str, set[str]]
    arguments: frozenset[str]
    rebound: dict[str, float]
    line: int
    enclosed: dict[str, Found]


class Sources:
    """Per code object and line, the names whose values the line computes from (flow-insensitive:
    every assignment of a local in the function counts), and which of them the function
    assigns itself; None where the source cannot be read (``exec``'d code)."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module | None] = {}
        self._flows: dict[CodeType, _Flow | None] = {}
        self._scopes: dict[int, _Flow] = {}
        self._known: dict[tuple[CodeType, int], Found | None] = {}

    def at(self, code: CodeType, line: int) -> Found | None:
        """What line ``line`` of ``code`` computes from: the names (its own and, through the
        locals it assigns, theirs), the subset ``code`` computes itself, whether a host
        build or a move to a device is among them, and, per free variable, what the
        enclosing function computes it from."""
        key = (code, line)
        if key not in self._known:
            flow = self._flow(code)
            self._known[key] = None if flow is None else _at_line(flow, line)
        return self._known[key]

    def _flow(self, code: CodeType) -> _Flow | None:
        if code not in self._flows:
            tree = self._tree(code.co_filename)
            scope = None if tree is None else _scope(tree, code)
            self._flows[code] = None if tree is None or scope is None else self._read(
                tree, scope)
        return self._flows[code]

    def _read(self, tree: ast.Module, scope: ast.AST) -> _Flow:
        """The flow of ``scope`` (once per node), its free variables judged in the innermost
        enclosing function that binds each."""
        known = self._scopes.get(id(scope))
        if known is not None:
            return known
        outer = None if scope is tree else _enclosing(tree, scope)
        flow = _read(scope, {} if outer is None else _free(scope, self._read(tree, outer)))
        self._scopes[id(scope)] = flow
        return flow

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
        first = _first_line(node)
        if first <= line <= (node.end_lineno or line):
            if first == line and getattr(node, "name", "<lambda>") == code.co_name:
                return node
            if found is None or node.lineno >= found.lineno:
                found = node
    return found


def _first_line(node: ast.AST) -> int:
    lines: list[int] = [getattr(node, "lineno", 1)]
    lines.extend(d.lineno for d in getattr(node, "decorator_list", ()))
    return min(lines)


def _enclosing(tree: ast.Module, scope: ast.AST) -> ast.AST | None:
    """The innermost function around ``scope`` (None: the module's top level)."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, _SCOPES) and node is not scope and any(
                sub is scope for sub in ast.walk(node)):
            if found is None or any(sub is node for sub in ast.walk(found)):
                found = node
    return found


def _free(scope: ast.AST, outer: _Flow) -> dict[str, Found]:
    """For each name ``scope`` loads and does not bind, that the enclosing function (``outer``)
    binds: what that function computes it from, as of ``scope``'s definition (an argument of
    ``outer`` rebound before then is no longer the one handed in)."""
    flow = _read(scope, {})
    loaded = {n for _, _, names in flow.statements for n in names if not _token(n)}
    bound = frozenset((*outer.defs, *outer.arguments))
    out: dict[str, Found] = {}
    for name in loaded - set(flow.defs) - flow.arguments:
        if name in outer.enclosed:
            out[name] = outer.enclosed[name]
        elif name in bound:
            start = {name}
            if name in outer.arguments and outer.rebound.get(name, math.inf) >= flow.line:
                start.add(_HANDED + name)
            out[name] = _found(outer, start, bound)
    return out


def _read(scope: ast.AST, enclosed: dict[str, Found]) -> _Flow:
    args = getattr(scope, "args", None)
    arguments = frozenset() if args is None else frozenset(
        a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
        if a is not None)
    reach = _reach(scope, arguments)
    statements: list[tuple[int, int, frozenset[str]]] = []
    defs: dict[str, set[str]] = {}
    if isinstance(scope, ast.Lambda):  # its body: one expression, as one statement
        statements.append((scope.lineno, scope.end_lineno or scope.lineno,
                           frozenset(_loads(scope.body, reach))))
    for node in _own_nodes(scope):
        if isinstance(node, ast.stmt):
            heads = _heads(node)
            loaded = frozenset(name for h in heads for name in _loads(h, reach))
            statements.append((node.lineno, node.end_lineno or node.lineno, loaded))
        for target, value in _assignments(node):
            names = set(_loads(value, reach))
            for name in _bound(target):
                defs.setdefault(name, set()).update(names)
    return _Flow(statements, defs, arguments, reach, _first_line(scope), enclosed)


def _reach(scope: ast.AST, arguments: frozenset[str]) -> dict[str, float]:
    """Per argument, the last line its value as handed in reaches: the end of the first
    statement of the function's body (not inside a branch or loop) that assigns it, else
    everywhere."""
    out = dict.fromkeys(arguments, math.inf)
    for node in () if isinstance(scope, ast.Lambda) else getattr(scope, "body", ()):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for name in (n for target, _ in _assignments(node) for n in _bound(target)):
                if out.get(name) == math.inf:
                    out[name] = node.end_lineno or node.lineno
    return out


def _bound(target: ast.AST) -> Iterable[str]:
    return (n.id for n in ast.walk(target) if isinstance(n, ast.Name))


def _loads(node: ast.AST, reach: Mapping[str, float]) -> list[str]:
    """The names ``node`` loads (an argument's, where its value as handed in reaches, with
    :data:`_HANDED` before it too), :data:`_BUILT` where it builds a tensor from host data (and
    what such a call builds from, unless a named value, is the host's) and :data:`_MOVED` where
    it moves a tensor to a device or makes one there."""
    out, todo = [], [node]
    while todo:
        sub = todo.pop()
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            out.append(sub.id)
            if sub.lineno <= reach.get(sub.id, -math.inf):
                out.append(_HANDED + sub.id)
        elif isinstance(sub, ast.Call):
            builds = _called(sub.func) in _BUILDS and not any(
                k.arg == "device" for k in sub.keywords)
            if builds:
                out.append(_BUILT)
            if _moves(sub):
                out.append(_MOVED)
            data = sub.args[0] if sub.args else next(
                (k.value for k in sub.keywords if k.arg == "data"), None)
            if builds and not isinstance(data, (ast.Name, ast.Attribute, ast.Subscript)):
                # torch.tensor([0] + list(points)): the host's, whatever it was built from
                todo.append(sub.func)
                todo.extend(k.value for k in sub.keywords if k.arg != "data")
                continue
        todo.extend(ast.iter_child_nodes(sub))
    return out


def _moves(call: ast.Call) -> bool:
    """Whether ``call`` moves a tensor to a device or makes one there: ``x.to(device)`` (not
    ``x.to(torch.float16)``), ``x.cuda()``, a ``device=`` that is not a literal CPU."""
    if any(k.arg == "device" and not _CPU.match(ast.unparse(k.value)) for k in call.keywords):
        return True
    decides = _MOVERS.get(_called(call.func) or "") if isinstance(
        call.func, ast.Attribute) else None
    if decides is None or not (decides and call.args):
        return decides is False
    first = call.args[0]
    return _called(first) not in _DTYPES and not _CPU.match(ast.unparse(first))


def _called(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)


def _token(name: str) -> bool:
    return name in (_BUILT, _MOVED) or name.startswith(_HANDED)


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


def _at_line(flow: _Flow, line: int) -> Found | None:
    around = [s for s in flow.statements if s[0] <= line <= s[1]]
    if not around:
        return None
    # the innermost statement: the one that starts last
    return _found(flow, max(around, key=lambda s: (s[0], -s[1]))[2], frozenset())


def _found(flow: _Flow, start: Iterable[str], hidden: frozenset[str]) -> Found:
    """What the names ``start`` compute from in ``flow``: through the locals it assigns."""
    names = set(start)
    todo = [n for n in names if n in flow.defs]
    while todo:
        for name in flow.defs[todo.pop()]:
            if name not in names:
                names.add(name)
                if name in flow.defs:
                    todo.append(name)
    handed = {n[len(_HANDED):] for n in names if n.startswith(_HANDED)}
    plain = frozenset(n for n in names if not _token(n))
    return Found(plain, frozenset(n for n in plain if n in flow.defs and n not in handed),
                 _BUILT in names, _MOVED in names,
                 {n: flow.enclosed[n] for n in plain if n in flow.enclosed},
                 hidden & plain)
