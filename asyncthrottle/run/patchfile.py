"""``run --suggest``: the certain rewrites of the report's read suggestions
(:mod:`~asyncthrottle.run.rewrite`) as unified diffs: one per suggestion, the report's
``patches``, and one patch of them all, which ``patch -p1`` and ``git apply`` take in the script's
folder (its paths are relative to it, as the report's sites are).

A file's rewrites share one throttle and one callback, made before the outermost loop around the
rewritten loop (in its function), with ``import asyncthrottle`` after the module's last import
before it; the loop's iterable is wrapped (``enumerate(thr.wrap(loader))``), and a loop with a
``break`` is followed by ``thr.drain()`` so that its last steps reach the callback before the
script goes on. A file's rewrites stay in one loop (the one of its most frequent read).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .advice import OFTEN
from .hunks import Edit, merged, unified
from .observers import also_writes
from .rewrite import VALUES, Change, Script
from .scriptast import segment

__all__ = ["patches"]

# context lines: of the patch file (what patch and git apply match), of a suggestion's own diff
_CONTEXT, _SHOWN_CONTEXT = 3, 1
_COMMENTS = {None: "calls log() once each step completes: no sync",
             "raise": "a NaN/Inf deferred: at.NonFiniteError once its step completes",
             "warn": "a NaN/Inf deferred: a warning once its step completes"}


def patches(rows: Sequence[dict[str, Any]] | None, root: str) -> tuple[list[dict[str, Any]], str]:
    """The report's ``patches`` and the patch of every certain rewrite (``""``: none).

    One entry for each read suggestion (the script's own read in most steps), in the rows' order:
    ``site``, ``call``, ``certain``, ``diff`` (the rewrite as a unified diff against the file,
    null where it is not certain) and ``why`` (why it is not certain, else null).

    Args:
        rows: the report's ``syncs`` (None: not counted).
        root: the script's folder, which the sites (and the patch's paths) are relative to.
    """
    chosen = [row for row in rows or () if row.get("via") is None and row["in_step"]
              and row["per_step"] >= OFTEN]
    files: dict[str, list[dict[str, Any]]] = {}
    for row in chosen:
        files.setdefault(_path(row, root), []).append(row)
    said: dict[int, tuple[str | None, str | None]] = {}
    whole = []
    for path, file_rows in files.items():
        judged = _file(path, root, file_rows)
        if isinstance(judged, str):
            said.update({id(row): (None, judged) for row in file_rows})
            continue
        edit, verdicts, patch = judged
        for row in file_rows:
            verdict = verdicts[_line(row)]
            said[id(row)] = (edit.diff([verdict], _SHOWN_CONTEXT, check=False), None) \
                if isinstance(verdict, Change) else (None, verdict)
        whole.append(patch)
    entries = [{"site": row["site"], "call": row["call"], "certain": said[id(row)][0] is not None,
                "diff": said[id(row)][0], "why": said[id(row)][1]} for row in chosen]
    return entries, "".join(whole)


def _path(row: dict[str, Any], root: str) -> str:
    return row.get("file") or os.path.join(root, row["site"].rpartition(":")[0])


def _line(row: dict[str, Any]) -> int:
    number = row["site"].rpartition(":")[2]
    return int(number) if number.isdigit() else 0


def _file(path: str, root: str, rows: list[dict[str, Any]]
          ) -> tuple[_Edit, dict[int, Change | str], str] | str:
    """The file's edit, the verdict on each row's line and the diff of all its certain
    rewrites (``""``: none); or why none is certain."""
    relative = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        return "its file is outside the script's folder"
    try:
        data = Path(path).read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        if encoding not in ("utf-8", "utf-8-sig"):
            return f"its file is not UTF-8 ({encoding})"
        script = Script(data.decode(encoding))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        return f"its file could not be read and parsed ({type(exc).__name__})"
    edit = _Edit(script, relative.replace(os.sep, "/"))
    settled = edit.settle({_line(row): script.judge(_line(row)) for row in rows})
    kept = list({id(v): v for v in settled.values() if isinstance(v, Change)}.values())
    try:
        return edit, settled, edit.diff(kept, _CONTEXT) if kept else ""
    except (SyntaxError, ValueError) as exc:  # a rewrite that would break the file: none
        why = f"the rewritten file would not parse ({exc}): please report it"
        return edit, {line: why if isinstance(v, Change) else v for line, v in settled.items()}, ""


@dataclasses.dataclass
class _Made:
    """The names the rewrite adds to a file: the module, the throttle, the callback."""

    at: str
    thr: str
    log: str


class _Edit:
    """A file's certain changes as edits of its lines."""

    def __init__(self, script: Script, relative: str) -> None:
        self.script, self.relative = script, relative
        lines = script.lines
        self.newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
        taken = script.names
        self.made = _Made(*(_free(name, taken) for name in ("at", "thr", "log")))

    def settle(self, verdicts: dict[int, Change | str]) -> dict[int, Change | str]:
        """The verdicts once the changes combine: one loop (the first row's), each name deferred
        once a step (a later read of a name whose value may change since its first stays
        advice), ``nonfinite="raise"`` only where it raises on the NaN checks' values alone; two
        lines of one statement share its verdict."""
        settled = dict(verdicts)
        firsts: dict[ast.stmt, int] = {}
        for line, v in verdicts.items():
            if isinstance(v, Change):  # two lines of one statement: one change, the first's
                firsts.setdefault(v.stmt, line)
        changes = [(line, v) for line, v in verdicts.items()
                   if isinstance(v, Change) and firsts[v.stmt] == line]
        if not changes:
            return settled
        loop = changes[0][1].loop
        places = {id(stmt): place for place, stmt in enumerate(loop.body)}
        deferred: dict[str, int] = {}
        for line, change in sorted(changes, key=lambda item: item[1].stmt.lineno):
            if change.loop is not loop:
                settled[line] = f"another loop of the file (line {loop.lineno}) is rewritten: " \
                                "one loop a file"
                continue
            place = places[id(change.stmt)]
            moved = [key for key in change.keys if key in deferred and not self.script.same(
                key, loop, deferred[key], place)]
            if moved:
                first = loop.body[deferred[moved[0]]].lineno
                settled[line] = f"{moved[0]} may change between its read on line {first} and " \
                                "this one (one value a name a step)"
                continue
            deferred.update({key: place for key in change.keys if key not in deferred})
        kept = [v for v in settled.values() if isinstance(v, Change)]
        checked = {key for v in kept if v.nonfinite == "raise" for key in v.keys}
        logged = {key for v in kept if v.nonfinite is None for key in v.reads} - checked
        for line, v in settled.items():
            if isinstance(v, Change) and v.nonfinite == "raise" and logged:
                settled[line] = f"nonfinite='raise' would also raise on a NaN in " \
                                f"{sorted(logged)[0]}, which the script only logs"
            elif isinstance(v, Change) and v.nonfinite == "warn" and checked and not logged:
                settled[line] = "another NaN check of the loop raises"
        _in_order(settled)
        return {line: settled[firsts[v.stmt]] if isinstance(v, Change) else v
                for line, v in verdicts.items()}

    def diff(self, changes: list[Change], context: int, *, check: bool = True) -> str:
        """The unified diff of the file with ``changes`` made (its edits and their context
        only); ``check``: the file so made is parsed first (a ``SyntaxError`` is a bug of the
        rewrite, not the script's). A suggestion's own diff is one change of the checked patch,
        made alone: not parsed again."""
        edits = self.edits(changes)
        if check:
            ast.parse("".join(merged(self.script.lines, edits, self.newline)))
        return unified(self.script.lines, edits, self.newline,
                       (f"a/{self.relative}", f"b/{self.relative}"), context)

    def edits(self, changes: list[Change]) -> list[Edit]:
        """The edits of the file's lines that make ``changes`` (all of one loop)."""
        script, made, nl = self.script, self.made, self.newline
        loop = changes[0].loop
        anchor = _anchor(loop, script.parent)
        indent = _indent(script.lines[anchor.lineno - 1])
        step = "step" if not any("step" in c.names for c in changes) else "_step"
        start = self._import_at(anchor)
        edits: list[Edit] = [(start, 0, [f"import asyncthrottle as {made.at}{nl}"], start),
                             (anchor.lineno - 1, 1, self._setup(changes, indent, step),
                              anchor.lineno - 1)]
        edits.append(self._wrap(loop))
        deferred: set[str] = set()
        for change in sorted(changes, key=lambda c: c.stmt.lineno):
            here = [key for key in change.keys if key not in deferred]
            deferred.update(here)
            at = _indent(script.lines[change.stmt.lineno - 1])
            edits.append((change.stmt.lineno - 1, 2, [
                f'{at}{made.thr}.defer({key}, name="{key}"){nl}' for key in here],
                change.stmt.end_lineno or change.stmt.lineno))
        if script.breaks(loop):
            at = _indent(script.lines[loop.lineno - 1])
            end = loop.end_lineno or loop.lineno
            edits.append((end, 3, [f"{at}{made.thr}.drain()  # the steps before the break reach "
                                   f"{made.log}() first{nl}"], end))
        return edits

    def _import_at(self, anchor: ast.stmt) -> int:
        """The line index after the module's last import before ``anchor``'s module-level
        statement (else after its docstring, else before its first statement)."""
        top: ast.AST = anchor
        while self.script.parent.get(top) is not self.script.tree:
            top = self.script.parent[top]
        start = getattr(top, "lineno", 1)
        body = self.script.tree.body
        imports = [s for s in body if isinstance(s, (ast.Import, ast.ImportFrom))
                   and s.lineno < start]
        if imports:
            return imports[-1].end_lineno or imports[-1].lineno
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str) and first is not top:
            return first.end_lineno or first.lineno
        return first.lineno - 1

    def _setup(self, changes: list[Change], indent: str, step: str) -> list[str]:
        """The throttle and the callback, at ``indent``."""
        made, nl = self.made, self.newline
        mode = next((c.nonfinite for c in changes if c.nonfinite == "raise"), None)
        option = f'nonfinite="{mode}"' if mode else ""
        logged = [c for c in changes if c.nonfinite is None]
        comment = _COMMENTS[mode or (None if logged else "warn")]
        lines = [f"{indent}{made.thr} = {made.at}.Throttle({option})  # {comment}{nl}"]
        if not logged:
            return lines
        unit = _unit(changes[0].loop, self.script.lines)
        inner = indent + unit
        lines += [f"{indent}@{made.thr}.on_complete{nl}",
                  f"{indent}def {made.log}({step}, {VALUES}):{nl}"]
        totals = sorted({c.total for c in logged if c.total})
        if totals:
            kind = "global" if isinstance(self.script.scope(changes[0].loop), ast.Module) \
                else "nonlocal"
            lines.append(f"{inner}{kind} {', '.join(totals)}{nl}")
        for change in sorted(logged, key=lambda c: c.stmt.lineno):
            lines += [f"{inner}{text}{nl}" if text.strip() else nl for text in change.body]
        return lines

    def _wrap(self, loop: ast.For) -> Edit:
        """The loop's header with its iterable wrapped: ``enumerate(thr.wrap(x))`` for an
        ``enumerate(x)``, else ``thr.wrap(x)``."""
        node: ast.expr = loop.iter
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "enumerate" and "enumerate" not in self.script.bound \
                and node.args and not isinstance(node.args[0], ast.Starred):
            node = node.args[0]
        lines = self.script.lines
        first, last = lines[node.lineno - 1].encode(), lines[(node.end_lineno or 1) - 1].encode()
        head = first[:node.col_offset].decode()
        tail = last[node.end_col_offset or 0:].decode()
        text = segment(self.script.lines, node) or ast.unparse(node)
        if isinstance(node, ast.Tuple) and not text.startswith("("):
            text = f"({text})"
        made = f"{head}{self.made.thr}.wrap({text}){tail}"
        return (node.lineno - 1, 2, io.StringIO(made, newline="").readlines(),
                node.end_lineno or node.lineno)


def _in_order(settled: dict[int, Change | str]) -> None:
    """A moved print stays certain only where every other line of its loop that writes to its
    stream moves too (into the callback, in their order); else it is advice, and so, in turn, are
    the prints that counted on it."""
    while True:
        moving = {id(v.stmt) for v in settled.values() if isinstance(v, Change)}
        stays = {line: v for line, v in settled.items() if isinstance(v, Change)
                 and any(id(other) not in moving for other in v.beside)}
        if not stays:
            return
        for line, v in stays.items():
            other = next(other for other in v.beside if id(other) not in moving)
            settled[line] = also_writes(f"line {other.lineno}", v.stream or "")


def _anchor(loop: ast.For, parent: dict[ast.AST, ast.AST]) -> ast.stmt:
    """The outermost loop of the loops ``loop`` is nested in, directly (or ``loop``)."""
    node: ast.stmt = loop
    above = parent.get(node)
    while isinstance(above, (ast.For, ast.While)) and node in above.body:
        node, above = above, parent.get(above)
    return node


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _unit(loop: ast.For, lines: list[str]) -> str:
    """One level of the file's indentation: its loop body's beyond its header."""
    inner, outer = _indent(lines[loop.body[0].lineno - 1]), _indent(lines[loop.lineno - 1])
    return inner[len(outer):] or "    "


def _free(name: str, taken: set[str]) -> str:
    """``name``, or ``name_``, ``name__``... : the first the script does not use."""
    while name in taken:
        name += "_"
    return name
