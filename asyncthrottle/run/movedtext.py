"""The text of a statement :mod:`.rewrite` moves into the ``on_complete`` callback: its lines with
each deferred name read from the step's values (``values["loss"]``), checked to parse as the
statement with those names replaced."""

from __future__ import annotations

import ast
import copy
from collections.abc import Sequence

from .scriptast import ancestors

__all__ = ["VALUES", "moved"]

# the callback's parameter for the step's values (a script that logs a name so is left alone)
VALUES = "values"


def moved(source: Sequence[str], parent: dict[ast.AST, ast.AST], stmt: ast.stmt,
      found: dict[ast.Name, str]) -> list[str] | str:
    """``stmt``'s lines of ``source`` (the script's lines) with each found name read from the
    values, unindented; or why not (a str)."""
    first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
    if last > first and any(isinstance(node, (ast.Constant, ast.JoinedStr)) and (
            node.end_lineno or 0) > node.lineno for node in ast.walk(stmt)):
        return "it logs a string of several lines"
    lines = [text.rstrip("\r\n") for text in source[first - 1:last]]
    for name in sorted(found, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        strings = [node for node in ancestors(name, parent, stmt)
                   if isinstance(node, ast.JoinedStr)]
        if len(strings) > 1:
            return "it logs an f-string inside an f-string"
        quote = "'" if strings and _quote(source, strings[0]) == '"' else '"'
        text = lines[name.lineno - first].encode()
        head = text[:name.col_offset].decode("utf-8", "replace")
        tail = text[name.end_col_offset or 0:].decode("utf-8", "replace")
        lines[name.lineno - first] = f"{head}{VALUES}[{quote}{found[name]}{quote}]{tail}"
    indent = len(source[first - 1].encode()[:stmt.col_offset].decode())
    out = [text[indent:] if not text[:indent].strip() else text for text in lines]
    expected = _Replaced(found).visit(copy.deepcopy(stmt))
    try:
        made = ast.parse("\n".join(out)).body
    except SyntaxError:
        made = []
    if [ast.dump(node) for node in made] != [ast.dump(expected)]:
        return "its text could not be rewritten"
    return out


def _quote(lines: Sequence[str], node: ast.JoinedStr) -> str:
    """The quote that starts the f-string ``node``."""
    text = lines[node.lineno - 1].encode()[node.col_offset:].decode("utf-8", "replace")
    return text.lstrip("rRfFbBuU")[:1]


class _Replaced(ast.NodeTransformer):
    """Each found name as ``values["name"]``."""

    def __init__(self, found: dict[ast.Name, str]) -> None:
        self.found = {(n.lineno, n.col_offset): key for n, key in found.items()}

    def visit_Name(self, node: ast.Name) -> ast.expr:
        key = self.found.get((node.lineno, node.col_offset))
        if key is None:
            return node
        return ast.Subscript(ast.Name(VALUES, ast.Load()), ast.Constant(key), ast.Load())
