"""A script file's source parsed and indexed once by line (as ``linecache`` holds it): each line's
text, the function around it and the expressions that may read on it, so that the report looks a
sync site up instead of walking the file's syntax tree once a site."""

from __future__ import annotations

import ast
import linecache
from collections import deque

__all__ = ["Index", "index", "site"]

# the files indexed last (a report names few; a long-running process must not keep them all)
_KEPT = 16
_KNOWN: dict[str, Index] = {}
# the nodes whose read is their test (``if x:`` reads ``x``): indexed by their test's lines
_TESTS = (ast.If, ast.While, ast.IfExp, ast.Assert)
# the nodes that may read: a call, an f-string's field, a subscript (a mask), a test
_READS = (ast.Call, ast.FormattedValue, ast.Subscript, *_TESTS)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class Index:
    """One file's ``lines`` (``linecache``'s list), its ``tree`` (None where it does not parse)
    and its lines' reads and functions, each found in one walk of the tree."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        try:
            self.tree: ast.Module | None = ast.parse("".join(lines))
        except (SyntaxError, ValueError):
            self.tree = None
        self._reads: dict[int, list[ast.AST]] = {}
        self._functions: list[str] = []
        if self.tree is not None:
            self._index(self.tree)

    def _index(self, tree: ast.Module) -> None:
        functions = ["<module>"] * (len(self.lines) + 2)
        # (node, the qualified name of the function or class it is in), in ast.walk's order (a
        # line's nodes keep it); parents come before their children, so an inner function's
        # lines overwrite its outer one's
        todo: deque[tuple[ast.AST, str]] = deque([(tree, "")])
        while todo:
            node, scope = todo.popleft()
            if isinstance(node, _READS):
                span = node.test if isinstance(node, _TESTS) else node
                for line in _lines(span):
                    self._reads.setdefault(line, []).append(node)
            if isinstance(node, _SCOPES):
                scope = f"{scope}.{node.name}" if scope else node.name
                functions[node.lineno:_end(node) + 1] = [scope] * (_end(node) + 1 - node.lineno)
            todo.extend((child, scope) for child in ast.iter_child_nodes(node))
        self._functions = functions[:len(self.lines) + 2]

    def reads(self, line: int) -> list[ast.AST]:
        """The nodes that may read on ``line``: calls, f-string fields and subscripts that span
        it, and the ``if``/``while``/``assert``/conditional expressions whose test spans it."""
        return self._reads.get(line, [])

    def function(self, line: int) -> str | None:
        """The qualified name of the function (or class) around ``line`` (``Trainer.step``),
        ``"<module>"`` at the top level; None where the file does not parse."""
        if self.tree is None or not 0 < line < len(self._functions):
            return None
        return self._functions[line]

    def text(self, line: int) -> str | None:
        """``line``'s text, its runs of white space made one space (None: no such line)."""
        if not 0 < line <= len(self.lines):
            return None
        return " ".join(self.lines[line - 1].split())


def _end(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", None) or getattr(node, "lineno", None) or 0)


def _lines(node: ast.AST) -> range:
    start = getattr(node, "lineno", None)
    return range(start, _end(node) + 1) if start is not None else range(0)


def index(file: str) -> Index:
    """``file``'s index, made once for its text as it is now (``linecache``, checked)."""
    linecache.checkcache(file)
    lines = linecache.getlines(file)
    known = _KNOWN.get(file)
    if known is None or known.lines is not lines:
        if len(_KNOWN) >= _KEPT:
            _KNOWN.pop(next(iter(_KNOWN)))
        known = _KNOWN[file] = Index(lines)
    return known


def site(file: str | None, site_name: str) -> dict[str, str | None]:
    """A report row's ``function`` and ``text`` for its ``site`` (``file.py:LINE``) in ``file``
    (None: both unknown)."""
    number = site_name.rpartition(":")[2]
    if file is None or not number.isdigit():
        return {"function": None, "text": None}
    found = index(file)
    return {"function": found.function(int(number)), "text": found.text(int(number))}
