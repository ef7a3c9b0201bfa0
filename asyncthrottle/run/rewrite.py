"""Which host reads ``run --suggest`` rewrites with certainty, found by ``ast`` in the script: a
read of a value that is only logged, and a NaN check that raises or warns.

A read is rewritten only where the script's observable behaviour stays the same: it logs the same
lines, in the same order, and ends the same way (:mod:`.observers` says what could see the work run
later). Its statement is a line of a ``for`` loop's own body (not inside an ``if`` there) that only
logs: ``print(...)`` to ``sys.stdout`` or ``sys.stderr``, where nothing else of the loop writes to
that stream (or only prints that move with it); ``LIST.append(...)`` of a list made ``[]`` once
before the loop and otherwise only read inside the arguments of a print or logging call after it
(in the same function); ``TOTAL += ...`` of a number so read. A logging call stays advice: its
record would name the callback's function and line. What it logs may hold constants, f-strings,
arithmetic, ``round``/``abs``/``min``/``max``/``str``/``len``/``sum``, the reads ``X.item()``,
``X.tolist()``, ``float(X)``, ``int(X)`` and ``f"{X:spec}"`` (a spec: a tensor's own text names its
device) of a name ``X`` the loop assigns (``X.detach()``, ``.float()``, ``.clone()``... before the
read: the same numbers on any device), and names that only ever hold a number or a string
(``for epoch in range(...)``, ``step = 0`` then ``step += 1``, an ``enumerate`` index). Anything
else (a tensor logged whole, an attribute, a call that could see later state) leaves the read as
advice. The statement moves into an ``on_complete`` callback, which runs once its step completes:
the names the loop assigns are deferred at its place (``thr.defer(loss, name="loss")``) and the
callback reads them from the step's values (``values["loss"].item()``: a host copy).

A NaN check (``if not torch.isfinite(loss):``, ``if torch.isnan(loss).any():``,
``if math.isnan(loss.item()):``, ...) whose branch only raises becomes
``Throttle(nonfinite="raise")`` where no handler of the script could see the error (no ``try`` or
``with`` around the loop or around a call of its function); the loss is deferred at its place. One
whose branch only calls ``warnings.warn(...)`` stays advice: the default ``nonfinite="warn"`` warns
another warning, later, which the script's warning filters (``-W error``) would treat otherwise.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import io

from .movedtext import VALUES, moved
from .observers import LOGGED, catcher, stream, writers
from .receivers import read_targets
from .scriptast import ancestors, binds, checked, exits, inside, names, plain, touches

__all__ = ["VALUES", "Change", "Script"]

_LOGGING = frozenset(("debug", "info", "warning", "warn", "error", "critical"))
_KINDS = {ast.If: "an if", ast.With: "a with", ast.Try: "a try", ast.For: "a loop",
          ast.While: "a loop"}
# why a read inside such a block is not rewritten: what the block does to the reads of a step
_EVERY_STEP = "run --suggest rewrites a statement of the loop's own body only"
_INSIDE = {ast.If: "not every step reads it", ast.For: "it reads several times a step",
           ast.While: "it reads several times a step"}
# calls that compute on host values only (their names must not be rebound by the script)
_PURE = frozenset(("round", "abs", "min", "max", "str", "len", "sum", "float", "int"))
# a tensor's methods that give the same numbers on every device, before a read
_EXACT = frozenset(("detach", "float", "double", "clone", "squeeze"))
# the reads whose host copy reads the same: receivers.read_targets' calls
_READS = ("item", "tolist", "__float__", "__int__", "__format__")


@dataclasses.dataclass
class Change:
    """One statement's rewrite.

    Attributes:
        stmt: the statement, a line of ``loop``'s own body.
        loop: the ``for`` loop whose iterable is wrapped.
        keys: the names it defers, in order (the deferred expression is the name).
        body: its lines in the callback, unindented (none for a NaN check).
        names: the names its lines in the callback use.
        reads: the keys that are not plain numbers (a NaN in them is seen by ``nonfinite=``).
        total: the name it adds to (``global``/``nonlocal`` in the callback), or None.
        nonfinite: ``"raise"`` or ``"warn"`` for a NaN check, else None.
        stream: the stream a moved ``print`` writes to (``"sys.stdout"``, ``"sys.stderr"``).
        beside: the other lines of the loop's body that write to that stream: the print is
            certain only where they all move with it (their order holds in the callback).
    """

    stmt: ast.stmt
    loop: ast.For
    keys: list[str]
    body: list[str]
    names: set[str] = dataclasses.field(default_factory=set)
    reads: set[str] = dataclasses.field(default_factory=set)
    total: str | None = None
    nonfinite: str | None = None
    stream: str | None = None
    beside: list[ast.stmt] = dataclasses.field(default_factory=list)


class Script:
    """A script's source and what its lines bind, to judge the reads of its lines."""

    def __init__(self, source: str) -> None:
        """Raises ``SyntaxError`` (or ``ValueError``) where ``source`` does not parse."""
        self.source = source
        self.lines = io.StringIO(source, newline="").readlines()
        self.tree = ast.parse(source)
        self.parent = {child: node for node in ast.walk(self.tree)
                       for child in ast.iter_child_nodes(node)}
        self.bound: dict[str, list[ast.AST]] = {}
        # each name's uses (in ast.walk's order), and the statements of loop bodies by line: the
        # file is walked here once, then each read's line is looked up (#56: a walk a read made
        # the report quadratic in a file's reads)
        self.uses: dict[str, list[ast.Name]] = {}
        self._held: dict[int, list[ast.stmt]] = {}
        for node in ast.walk(self.tree):
            for name in binds(node):
                self.bound.setdefault(name, []).append(node)
            if isinstance(node, ast.Name):
                self.uses.setdefault(node.id, []).append(node)
            if isinstance(node, ast.stmt) and self._loop_line(node):
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    self._held.setdefault(line, []).append(node)
        self.names: set[str] = set(self.uses) | set(self.bound)
        # what is known of a loop, a name in a loop, a name: found once, when first asked
        self._loops: dict[ast.For, tuple[str | None, list[ast.stmt]]] = {}
        self._touched: dict[ast.For, dict[str, list[int]]] = {}
        self._variable: dict[tuple[str, ast.For], bool] = {}
        self._scalars: dict[str, bool] = {}
        self.imports_us = any(isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            == "asyncthrottle" for alias in node.names) for node in ast.walk(self.tree))

    # -- a line's statement --------------------------------------------------------------------

    def judge(self, line: int) -> Change | str:
        """The rewrite of the read on ``line``, or why it stays advice."""
        if self.imports_us:
            return "the script uses asyncthrottle already"
        stmt = self._statement(line)
        if isinstance(stmt, str):
            return stmt
        loop = self.parent[stmt]
        assert isinstance(loop, ast.For)
        why = self._loop(loop, stmt)
        if why is not None:
            return why
        if isinstance(stmt, ast.If):
            return self._nan_check(stmt, loop)
        return self._logged(stmt, loop)

    def _statement(self, line: int) -> ast.stmt | str:
        """The innermost statement of a ``for`` loop's own body that holds ``line``: a simple
        statement, or an ``if`` whose test is on ``line``."""
        held = self._held.get(line, [])
        if not held:
            return "its line is not in a for loop's own body (it may be in a function the " \
                   "loop calls)"
        stmt = max(held, key=lambda node: len(list(ancestors(node, self.parent, None))))
        if isinstance(self.parent[stmt], ast.While):
            return "its loop is a while loop (run --suggest wraps a for loop's iterable)"
        nested = [child for child in ast.iter_child_nodes(stmt) if isinstance(child, ast.stmt)]
        if nested and not (isinstance(stmt, ast.If) and stmt.test.lineno <= line
                           <= (stmt.test.end_lineno or line)):
            return f"its line is inside {_KINDS.get(type(stmt), 'a block')} in the loop's body " \
                   f"({_INSIDE.get(type(stmt), _EVERY_STEP)})"
        return stmt if self._whole_lines(stmt) else "its statement shares a line with another"

    def _loop_line(self, stmt: ast.stmt) -> bool:
        """``stmt`` is a line of a loop's own body."""
        above = self.parent.get(stmt)
        return isinstance(above, (ast.For, ast.While)) and stmt in above.body

    def _whole_lines(self, stmt: ast.stmt) -> bool:
        """Nothing but the statement (and a comment) on its lines."""
        first, last = self.lines[stmt.lineno - 1], self.lines[(stmt.end_lineno or 1) - 1]
        before = first.encode()[:stmt.col_offset].decode("utf-8", "replace")
        after = last.encode()[stmt.end_col_offset or 0:].decode("utf-8", "replace").strip()
        return not before.strip() and (not after or after.startswith("#"))

    def _loop(self, loop: ast.For, stmt: ast.stmt) -> str | None:
        """Why the loop's steps could not all deliver ``stmt``'s values, or None."""
        leaves, skips = self._exits(loop)
        if leaves is not None:
            return leaves
        if skips and skips[0].lineno < stmt.lineno:
            return (f"the loop's {type(skips[0]).__name__.lower()} on line {skips[0].lineno} may "
                    "skip it (a step with no value)")
        scope = self.scope(loop)
        if isinstance(scope, (ast.ClassDef, ast.Lambda)):
            return "its loop is in a class body"
        return None

    def _exits(self, loop: ast.For) -> tuple[str | None, list[ast.stmt]]:
        """Why the loop may leave before its last step is delivered (a return or a yield; None),
        and its own ``break`` and ``continue`` statements, the first first: found once a loop."""
        if loop not in self._loops:
            leaves, skips = exits(loop)
            said = "its loop may leave by a return or a yield (the last steps would not be " \
                   "delivered)" if leaves else None
            self._loops[loop] = (said, skips)
        return self._loops[loop]

    def breaks(self, loop: ast.For) -> bool:
        """``loop`` may leave by a ``break`` of its own."""
        return any(isinstance(node, ast.Break) for node in self._exits(loop)[1])

    # -- a value that is only logged -----------------------------------------------------------

    def _logged(self, stmt: ast.stmt, loop: ast.For) -> Change | str:
        parts, total = self._logging(stmt, loop)
        if isinstance(parts, str):
            return parts
        printed = stmt.value if isinstance(stmt, ast.Expr) and isinstance(
            stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) else None
        to = stream(self, printed) if printed is not None else None
        beside = writers(self, loop, stmt, to) if to is not None else []
        if isinstance(beside, str):
            return beside
        found: dict[ast.Name, str] = {}
        for part in parts:
            why = self._value(part, loop, found)
            if why is not None:
                return why
        if not found:
            return "it logs no value the loop computes"
        left = {node.id for node in names(stmt) if node not in found}
        if VALUES in left:
            return f"it uses the name {VALUES!r}, the callback's"
        body = moved(self.lines, self.parent, stmt, found)
        if isinstance(body, str):
            return body
        keys = [found[name] for name in sorted(found, key=lambda n: (n.lineno, n.col_offset))]
        reads = {key for key in keys if not self._scalar(key)}
        return Change(stmt, loop, list(dict.fromkeys(keys)), body, left, reads, total,
                      stream=to, beside=beside)

    def _logging(self, stmt: ast.stmt, loop: ast.For) -> tuple[list[ast.expr] | str, str | None]:
        """What ``stmt`` logs, and the total it adds to; or why it is more than logging."""
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            total = stmt.target.id
            if not isinstance(stmt.op, ast.Add):
                return "it updates a value by more than +=", None
            why = self._printed(total, stmt, loop, (int, float))
            return ([stmt.value], total) if why is None else (why, None)
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(call, ast.Call):
            return "its statement is more than a print, a logging call or a list's append", None
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and isinstance(
                func.value, ast.Name) and len(call.args) == 1 and not call.keywords:
            why = self._printed(func.value.id, stmt, loop, None)
            return ([call.args[0]], None) if why is None else (why, None)
        if not self._logging_call(func, loop):
            return "its statement is more than a print, a logging call or a list's append", None
        if isinstance(func, ast.Attribute):
            return LOGGED, None
        if stream(self, call) is None:
            return ("it prints to a file other than sys.stdout or sys.stderr, which the script "
                    "may read back: moved into the callback, its lines would come late"), None
        parts = list(call.args)
        for keyword in call.keywords:
            if keyword.arg == "file":
                continue
            if keyword.arg is None:
                return "it passes **keywords", None
            parts.append(keyword.value)
        return parts, None

    def _logging_call(self, func: ast.expr, loop: ast.For) -> bool:
        """``print`` (not rebound), or a logger's method (a name the loop does not assign)."""
        if isinstance(func, ast.Name):
            return func.id == "print" and func.id not in self.bound
        return (isinstance(func, ast.Attribute) and func.attr in _LOGGING
                and isinstance(func.value, ast.Name) and not self._varies(func.value.id, loop))

    def _printed(self, name: str, stmt: ast.stmt, loop: ast.For,
                 numbers: tuple[type, ...] | None) -> str | None:
        """Why ``name`` (a list, or a total when ``numbers``) is more than printed after the loop;
        None when it is only that."""
        scope = self.scope(loop)
        made = [node for node in self.bound.get(name, []) if node is not stmt]
        start = made[0] if len(made) == 1 else None
        if not isinstance(start, ast.Assign) or self.scope(start) is not scope \
                or inside(start, loop, self.parent) or start.lineno > loop.lineno:
            return f"{name} is assigned elsewhere than once before the loop"
        value = start.value
        fresh = (isinstance(value, ast.Constant) and isinstance(value.value, numbers)
                 and not isinstance(value.value, bool)) if numbers else (
            isinstance(value, ast.List) and not value.elts)
        if not fresh:
            return f"{name} does not start as {'a number' if numbers else '[]'}"
        for node in self.uses.get(name, []):
            if node.ctx.__class__ is ast.Store:
                continue
            if inside(node, stmt, self.parent):
                continue
            if self.scope(node) is not scope or inside(node, loop, self.parent) \
                    or not self._print_argument(node, loop):
                return f"{name} is used elsewhere than in a print after the loop (line " \
                       f"{node.lineno})"
        return None

    def _print_argument(self, node: ast.Name, loop: ast.For) -> bool:
        """``node`` is read inside a print/logging call's arguments (not a method called on
        it)."""
        above = self.parent[node]
        if isinstance(above, ast.Attribute) or (isinstance(above, ast.Call)
                                                and above.func is node):
            return False
        while not isinstance(above, ast.stmt):
            if isinstance(above, ast.Call) and self._logging_call(above.func, loop) \
                    and not inside(node, above.func, self.parent):
                return True
            above = self.parent[above]
        return False

    def _value(self, node: ast.expr, loop: ast.For, found: dict[ast.Name, str]) -> str | None:
        """Why the logged ``node`` cannot be computed later in the callback, or None; ``found``
        gains the names the loop assigns, to be read from the step's deferred values."""
        read = self._read(node)
        name = read or (node if isinstance(node, ast.Name) else None)
        if name is not None:
            varies = self._varies(name.id, loop)
            if read is None and not self._scalar(name.id):
                return (f"it logs {name.id} as it is, not a number read from it (a tensor's "
                        "text names its device)") if varies else \
                    f"it logs {name.id}, which the callback would read later, not as it was"
            if read is not None and not varies and not self._scalar(name.id):
                return f"it reads {name.id}, which the loop does not assign (the callback " \
                       "would read it later)"
            if varies:
                found[name] = name.id
            spec = node.format_spec if isinstance(node, ast.FormattedValue) else None
            return self._value(spec, loop, found) if spec is not None else None
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Call):
            func = node.func
            pure = isinstance(func, ast.Name) and func.id in _PURE and func.id not in self.bound
            formats = isinstance(func, ast.Attribute) and func.attr == "format" \
                and isinstance(func.value, ast.Constant)
            if not (pure or formats):
                return f"it calls {ast.unparse(func)}(), which the callback would call later"
            children = [*node.args, *(keyword.value for keyword in node.keywords)]
        elif isinstance(node, (ast.JoinedStr, ast.FormattedValue, ast.BinOp, ast.UnaryOp,
                               ast.BoolOp, ast.Compare, ast.IfExp, ast.Tuple, ast.List)):
            children = [child for child in ast.iter_child_nodes(node)
                        if isinstance(child, ast.expr)]
        else:
            return f"it logs {ast.unparse(node)}, more than a value read from the step"
        for child in children:
            why = self._value(child, loop, found)
            if why is not None:
                return why
        return None

    def _read(self, node: ast.expr) -> ast.Name | None:
        """The name ``node`` reads a number from (``loss`` of ``float(loss.detach())``,
        ``f"{loss:.4f}"``), or None."""
        if isinstance(node, ast.FormattedValue) and node.format_spec is None:
            return None
        if isinstance(node, ast.Call):
            # float(x), int(x) (not rebound); x.item(), x.tolist(): no other arguments
            func = node.func
            builtin = isinstance(func, ast.Name)
            rebound = isinstance(func, ast.Name) and func.id in self.bound
            if node.keywords or len(node.args) != int(builtin) or rebound:
                return None
        targets = [target for call in _READS for read, target in read_targets(node, call)
                   if read is node]
        target = targets[0] if len(targets) == 1 else None
        while isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute) \
                and target.func.attr in _EXACT and not target.args and not target.keywords:
            target = target.func.value
        return target if isinstance(target, ast.Name) else None

    # -- a NaN check ---------------------------------------------------------------------------

    def _nan_check(self, stmt: ast.If, loop: ast.For) -> Change | str:
        looked_at = checked(stmt.test)
        if looked_at is None:
            return "its if is no NaN/Inf check of a tensor the loop computes"
        if not self._varies(looked_at, loop):
            return f"it checks {looked_at}, which the loop does not assign"
        if stmt.orelse or len(stmt.body) != 1:
            return "its NaN check does more than raise or warn (an else, several lines)"
        action = stmt.body[0]
        if isinstance(action, ast.Raise):
            caught = catcher(self, loop)
            if caught is not None:
                return caught
            return Change(stmt, loop, [looked_at], [], reads={looked_at}, nonfinite="raise")
        call = action.value if isinstance(action, ast.Expr) else None
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "warnings.warn":
            # the default nonfinite="warn" warns too, but its own warning, once the step completes:
            # the script's filters (-W error, catch_warnings) would act on another warning, later
            return ('its NaN check warns: nonfinite="warn" (the default) warns too, with its own '
                    "message, once the step completes, so the script's warning filters (-W "
                    "error) would see another warning, later")
        return "its NaN check does more than raise or warn (a break, a print, a skip)"

    # -- names ---------------------------------------------------------------------------------

    def _varies(self, name: str, loop: ast.For) -> bool:
        """The loop (its target or body) assigns ``name`` (found once a name and loop)."""
        key = (name, loop)
        if key not in self._variable:
            self._variable[key] = any(inside(node, loop, self.parent)
                                      for node in self.bound.get(name, []))
        return self._variable[key]

    def _scalar(self, name: str) -> bool:
        """Every binding of ``name`` gives a plain number or string: a constant, ``+=`` a
        constant, ``for NAME in range(...)``, an ``enumerate`` index."""
        if name not in self._scalars:
            nodes = self.bound.get(name, [])
            self._scalars[name] = bool(nodes) and all(plain(node, name, self.bound)
                                                      for node in nodes)
        return self._scalars[name]

    def same(self, name: str, loop: ast.For, start: int, stop: int) -> bool:
        """``name`` holds the same value through ``loop.body[start:stop]``: it is not assigned
        there nor changed in place (``name.add_(...)``, ``name[...] = ...``), and the loop makes
        it fresh (a call's or an operator's result: not a view or an alias of a tensor an
        optimizer could change in place)."""
        made = [node for node in self.bound.get(name, []) if inside(node, loop, self.parent)]
        fresh = all(isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, (ast.Call, ast.BinOp, ast.UnaryOp))
                    for node in made)
        if not (fresh or self._scalar(name)):
            return False
        touched = self._touches(loop).get(name, [])
        first = bisect.bisect_left(touched, start)
        return first == len(touched) or touched[first] >= stop

    def _touches(self, loop: ast.For) -> dict[str, list[int]]:
        """Each name's places in ``loop``'s body (the positions of its statements) that assign
        it or change it in place, in order: found in one walk of the body a loop."""
        if loop not in self._touched:
            self._touched[loop] = touches(loop.body)
        return self._touched[loop]

    def scope(self, node: ast.AST) -> ast.AST:
        """The function, class, lambda or module ``node`` is in."""
        above = self.parent.get(node)
        while above is not None and not isinstance(above, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                           ast.ClassDef, ast.Lambda)):
            above = self.parent.get(above)
        return above if above is not None else self.tree
