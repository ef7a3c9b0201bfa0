"""What could see a rewrite's work run later, for :mod:`.rewrite`: a rewrite is certain only where
nothing in the script can tell.

A moved line runs in the ``on_complete`` callback, once its step completes (on an accelerator up to
``depth`` steps later), and a NaN check's error is raised as its step's values arrive, not at the
check. So a moved ``print`` must write to ``sys.stdout`` or ``sys.stderr`` and be the only writer of
that stream in the loop (or write beside lines that move with it, :func:`writers`): another line,
a buffer the loop reads back, a logger or a progress bar on that stream would see its lines come
late. A logging call never moves (:data:`LOGGED`): its record names the function and the line it
was made at, and its time. A raised error must reach no handler (:func:`catcher`): no ``try``
around the loop, nor around a call of the loop's function (followed up to the module's own lines),
nor a ``with`` that sees it; where a call cannot be followed, nothing is proven.
"""

from __future__ import annotations

import ast
import weakref
from typing import TYPE_CHECKING, Any, TypeGuard

from .scriptast import own

if TYPE_CHECKING:
    from .rewrite import Script

__all__ = ["LOGGED", "STDERR", "STDOUT", "also_writes", "catcher", "stream", "writers"]

STDOUT, STDERR = "sys.stdout", "sys.stderr"
# why a logging call stays advice
LOGGED = ("it logs through logging: moved into the callback, its records would name the "
          "callback's function and line (%(funcName)s, %(lineno)d) and a later time")
# a logger's methods and progress bars: their handlers and lines may go to either stream
_LOGGING = frozenset(("debug", "info", "warning", "warn", "error", "critical", "exception",
                      "log"))
_BARS = frozenset(("tqdm", "trange"))
# a with's context that never sees, nor stops, the error passing through it: torch's modes
_INERT = "torch."


def stream(script: Script, call: ast.Call) -> str | None:
    """The stream a ``print`` call writes to: ``sys.stdout`` (no ``file=``, or that one) or
    ``sys.stderr``; None for any other file (a buffer, a log file, a name)."""
    files = [keyword.value for keyword in call.keywords if keyword.arg == "file"]
    if not files:
        return STDOUT
    text = ast.unparse(files[0])
    sys_module = all(isinstance(node, ast.Import) for node in script.bound.get("sys", [None]))
    return text if text in (STDOUT, STDERR) and sys_module else None


def writers(script: Script, loop: ast.For, moved: ast.stmt, to: str) -> list[ast.stmt] | str:
    """The other prints of ``loop``'s own body to ``to`` (a moved line may go only where those
    move too: their order holds in the callback); or why none may, when something else the loop
    runs writes there (a line of its body, its header, a function of the script it calls)."""
    lines, rest = _writing(script, loop, to)
    found: list[ast.stmt] = []
    for top, hit in lines:
        if top is moved or hit is None:
            continue
        if hit is top:
            found.append(top)
        else:
            return also_writes(f"line {getattr(hit, 'lineno', top.lineno)}", to)
    return rest if rest is not None else found


# each script's loops, by loop and stream: what _writing found (a loop's prints are judged one by
# one, and each asks of the whole loop: walked once, not once a print)
_FOUND: weakref.WeakKeyDictionary[Script, dict[tuple[int, str], Any]] = \
    weakref.WeakKeyDictionary()


def _writing(script: Script, loop: ast.For, to: str
             ) -> tuple[list[tuple[ast.stmt, ast.AST | None]], str | None]:
    """Each line of ``loop``'s body with what in it writes to ``to`` (the line itself where it
    is a print there; None: nothing, or a print to another stream), and why the loop's header or
    a function it calls writes there (None: they do not)."""
    known = _FOUND.setdefault(script, {})
    key = (id(loop), to)
    if key in known:
        return known[key]  # type: ignore[no-any-return]
    lines: list[tuple[ast.stmt, ast.AST | None]] = []
    for top in loop.body:
        call = top.value if isinstance(top, ast.Expr) else None
        if _printed(call) and stream(script, call) is not None:
            lines.append((top, top if stream(script, call) == to else None))
            continue
        lines.append((top, next((node for node in ast.walk(top) if _writes(script, node, to)),
                                None)))
    rest = None
    if any(_writes(script, node, to) for node in [*ast.walk(loop.target), *ast.walk(loop.iter)]):
        rest = also_writes("the loop's header", to)
    elif any(_writes(script, node, to) for function in _called(script, loop.body)
             for node in ast.walk(function)):
        rest = also_writes("a function the loop calls", to)
    known[key] = (lines, rest)
    return lines, rest


def _printed(call: ast.AST | None) -> TypeGuard[ast.Call]:
    """``call`` is a call of ``print``."""
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
        and call.func.id == "print"


def also_writes(where: str, to: str) -> str:
    """Why a print stays advice: ``where`` writes to its stream ``to`` and stays in the loop."""
    return (f"{where} also writes to {to}, and stays: its lines and the moved ones would change "
            "order")


def _called(script: Script, body: list[ast.stmt]) -> list[ast.AST]:
    """The script's functions that ``body`` calls by name, and those they call, once each."""
    seen: dict[int, ast.AST] = {}
    todo: list[ast.AST] = list(body)
    while todo:
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                for made in script.bound.get(node.func.id, []):
                    if isinstance(made, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and id(made) not in seen:
                        seen[id(made)] = made
                        todo.append(made)
    return list(seen.values())


def _writes(script: Script, node: ast.AST, to: str) -> bool:
    """``node`` writes to the stream ``to``, or may (a print to a file it cannot name)."""
    if isinstance(node, ast.Call) and _printed(node):
        return stream(script, node) in (to, None)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in _LOGGING:
        return True
    if isinstance(node, ast.Attribute) and ast.unparse(node) == to:
        return True
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in _BARS or (to == STDERR and name == "warnings")


def catcher(script: Script, loop: ast.AST) -> str | None:
    """Why an error raised in ``loop`` could reach a handler of the script (a ``try`` or a
    ``with`` around it or around a call of its function, up to the module's lines), or None when
    none can: it ends the script as the check's own error would."""
    seen: set[int] = set()
    todo: list[ast.AST] = [loop]
    while todo:
        node = todo.pop()
        around = _around(script, node)
        if around is not None:
            return around
        scope = script.scope(node)
        if isinstance(scope, ast.Module) or id(scope) in seen:
            continue
        seen.add(id(scope))
        calls = _calls(script, scope)
        if isinstance(calls, str):
            return calls
        todo.extend(calls)
    return None


def _around(script: Script, node: ast.AST) -> str | None:
    """Why a ``try`` or a ``with`` between ``node`` and its function (or module) sees an error
    raised at ``node``, or None."""
    above = script.parent.get(node)
    while above is not None and not isinstance(above, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda, ast.ClassDef)):
        if isinstance(above, ast.Try) and (above.handlers or above.finalbody):
            return (f"the try on line {above.lineno} would see asyncthrottle.NonFiniteError "
                    "(a FloatingPointError), raised steps later, instead of the script's error")
        if isinstance(above, (ast.With, ast.AsyncWith)) and not all(
                ast.unparse(item.context_expr).startswith(_INERT) for item in above.items):
            return (f"the with on line {above.lineno} would see the error, raised steps later "
                    "and of another type")
        above = script.parent.get(above)
    return None


def _calls(script: Script, function: ast.AST) -> list[ast.AST] | str:
    """Every call of ``function``, or why they cannot all be found: it is a function of the
    module's own lines, bound once, undecorated, no generator, and each use of its name calls
    it."""
    if not isinstance(function, ast.FunctionDef) or not isinstance(
            script.parent.get(function), ast.Module):
        return "its loop is in a function that is not one of the module's own (a method, a " \
               "nested or async function): its callers cannot be followed"
    name = function.name
    if function.decorator_list or script.bound.get(name) != [function] or any(
            isinstance(node, (ast.Yield, ast.YieldFrom))
            for node in own(function.body, loops=False)):
        return f"{name}() is decorated, bound again or a generator: its callers cannot be followed"
    uses = [node for node in ast.walk(script.tree) if isinstance(node, ast.Name)
            and node.id == name]
    calls = [use for use in uses if isinstance(script.parent.get(use), ast.Call)
             and script.parent[use].func is use]  # type: ignore[attr-defined]
    if not uses or len(calls) != len(uses):
        return f"{name}() is {'passed as a value' if uses else 'never called'} in the script: " \
               "its callers cannot be followed"
    return list(calls)

