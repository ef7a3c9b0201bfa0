"""The package's architecture rules, read from its source: no import circle at run time, ``core/`` imports nothing
outside it, the audit imports nothing of the runner (nor the test helpers of it), nothing outside ``backends/``
compares a device-kind string, no module is over 320 lines of code (the Throttle's façade over 200), and no module
reads another module's private attributes."""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "asyncthrottle"


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, *, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: at the top, in functions, in ``try``; under ``if TYPE_CHECKING:`` only
    with ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _from(node: ast.ImportFrom, module: str, path: Path) -> str:
    """The absolute module a ``from`` import names (``from ..x import y`` in ``pkg.sub.m``: ``pkg.x``), resolved
    from ``module``, the importer (at ``path``)."""
    base = node.module or ""
    if node.level:
        package = (module if path.name == "__init__.py" else module.rpartition(".")[0]).split(".")
        base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
    return base


def _ancestors(name: str) -> set[str]:
    return {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules its run-time imports execute (a relative import resolved; ``from p import m``
    is both ``p`` and ``p.m``; a module's parent packages run before it, so its own are left out)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = _from(node, name, path)
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
        # importing a module runs its parent packages first
        targets.update(ancestor for target in list(targets) for ancestor in _ancestors(target))
        graph[name] = {target for target in targets if target in modules and target != name} - _ancestors(name)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return circles


def test_no_module_of_the_package_imports_itself_back_at_run_time() -> None:
    """A circle of imports (even through an import inside a function, made at the first call) makes the order of
    first imports matter and a module half-initialised when the circle closes: the package has none."""
    assert import_circles(import_graph()) == []


def test_the_circle_finder_sees_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("from . import a\n")
    (root / "a.py").write_text("from .sub.b import thing\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n"
        "def thing():\n    from .. import a\n")
    (root / "c.py").write_text("from .sub import b\n")
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}  # not pkg.c
    assert import_circles(graph) == [["pkg.a", "pkg.sub.b"]]


def imports_outside_core(root: Path = PACKAGE) -> list[str]:
    """``file:line: module`` for each import in ``<root>/core/`` of a module outside it: of the package outside
    ``<root>.core``, or of anything but the standard library. ``if TYPE_CHECKING:`` imports count: a type from
    outside in the core's signatures is the outside known to the core (mypy, and a reader, must import it)."""
    core = f"{root.name}.core"
    found = []
    for name, path in _modules(root).items():
        if name != core and not name.startswith(f"{core}."):
            continue
        for node in _imports(ast.parse(path.read_text(), str(path)), type_checking=True):
            targets = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [
                _from(node, name, path)]
            for target in targets:
                inside = target == core or target.startswith(f"{core}.")
                if not inside and (target.split(".")[0] == root.name or target.split(".")[0] not in
                                   sys.stdlib_module_names):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {target}")
    return found


def test_the_core_imports_nothing_outside_it() -> None:
    """The rule knows devices only as events: nothing of the package outside ``core/``, no torch, no numpy."""
    assert imports_outside_core() == []


def test_the_core_import_check_sees_the_package_a_third_party_and_a_type_checking_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "core").mkdir(parents=True)
    (root / "__init__.py").write_text("import numpy\n")  # outside core/: not its business
    (root / "view.py").write_text("")
    (root / "core" / "__init__.py").write_text("from . import rule\nfrom .rule import Core\n")
    (root / "core" / "rule.py").write_text(
        "from __future__ import annotations\nimport collections.abc, os\nfrom typing import TYPE_CHECKING\n"
        "from .events import Event\nfrom pkg.core import events\nif TYPE_CHECKING:\n    from ..view import Pass\n"
        "def record():\n    import torch\n    from .. import view\n")
    (root / "core" / "events.py").write_text("import numpy as np, sys\n")
    assert imports_outside_core(root) == [
        "pkg/core/events.py:1: numpy", "pkg/core/rule.py:7: pkg.view", "pkg/core/rule.py:9: torch",
        "pkg/core/rule.py:10: pkg"]


# The rooms below another: each imports nothing of the rooms named (``if TYPE_CHECKING:`` imports too). The
# sync audit is the library's, under ``run`` and ``forbid_syncs()`` alike.
LAYERS = {"audit": ("run", "testing"), "testing": ("run",)}


def imports_across_layers(root: Path = PACKAGE,
                          layers: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """``file:line: module`` for each import in a room of ``layers`` (``<root>/<room>/``) of a module in one of
    the rooms it must not import (``<root>.<other>`` or below it)."""
    layers = LAYERS if layers is None else layers
    found = []
    for name, path in _modules(root).items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in layers:
            continue
        below = tuple(f"{root.name}.{other}" for other in layers[parts[1]])
        for node in _imports(ast.parse(path.read_text(), str(path)), type_checking=True):
            targets = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [
                _from(node, name, path)]
            if isinstance(node, ast.ImportFrom) and targets == [root.name]:  # from .. import run
                targets = [f"{root.name}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in below or target.startswith(tuple(f"{b}." for b in below)):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {target}")
    return found


def test_the_audit_imports_nothing_of_the_runner_nor_the_test_helpers_of_the_runner() -> None:
    """``run`` and ``asyncthrottle.testing.forbid_syncs`` both stand on the audit; it stands on neither, and the
    test helpers reach into none of the runner's internals."""
    assert imports_across_layers() == []


def test_the_layer_check_sees_a_relative_an_absolute_and_a_type_checking_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for room in ("audit", "run"):
        (root / room).mkdir(parents=True)
        (root / room / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "run" / "steps.py").write_text("from ..audit import frames\n")  # the runner on the audit: fine
    (root / "audit" / "frames.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .reads import x\nfrom ..parts import y\n"
        "if TYPE_CHECKING:\n    from ..run.steps import Steps\ndef f():\n    import pkg.run\n"
        "    from .. import run\n    from pkg.runner import z\n")
    assert imports_across_layers(root, {"audit": ("run",)}) == [
        "pkg/audit/frames.py:5: pkg.run.steps", "pkg/audit/frames.py:7: pkg.run",
        "pkg/audit/frames.py:8: pkg.run"]


# the device kinds torch and the package know (Backend.kind's "jax" included); "cuda:1" is one too
DEVICE_KINDS = frozenset({"cpu", "cuda", "hip", "mps", "xpu", "npu", "hpu", "tpu", "gpu", "ipu", "xla", "mtia",
                          "maia", "meta", "lazy", "privateuseone", "jax"})


def _names_a_kind(node: ast.expr, bound: frozenset[str] = frozenset()) -> bool:
    """A device-kind str, a literal tuple/list/set (or frozenset()/set()/tuple() of one) holding one, or a name in
    ``bound`` (the module's names bound to one)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.split(":")[0] in DEVICE_KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(item) for item in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        return node.func.id in ("frozenset", "set", "tuple") and _names_a_kind(node.args[0])
    return isinstance(node, ast.Name) and node.id in bound


def _kind_names(tree: ast.Module) -> frozenset[str]:
    """The module-level names bound to a device kind or a collection of them (``_PINNED = ("cuda", "xpu")``)."""
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        if value is not None and _names_a_kind(value):
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return frozenset(names)


def _operands(node: ast.AST) -> list[ast.expr]:
    """What ``node`` compares, if it is a comparison: a ``Compare``'s operands, a ``match`` case's value, the
    argument of ``str.startswith``/``endswith`` (``str(device).startswith("cpu")`` compares a kind as well)."""
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.MatchValue):
        return [node.value]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "startswith", "endswith"):
        return node.args[:1]
    return []


def kind_comparisons(root: Path = PACKAGE) -> list[str]:
    """``file:line`` of each comparison outside ``<root>/backends/`` (``==``, ``!=``, ``in``, ``not in``, ``is``, a
    ``match`` case, ``startswith``) one of whose operands names a device kind (:func:`_names_a_kind`)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "backends":
            continue
        tree = ast.parse(path.read_text(), str(path))
        bound = _kind_names(tree)
        lines = []
        for node in ast.walk(tree):
            if any(_names_a_kind(operand, bound) for operand in _operands(node)):
                lines.append(node.lineno)
        found += [f"{path.relative_to(root.parent)}:{line}" for line in sorted(lines)]
    return found


def test_nothing_outside_the_backends_compares_a_device_kind_string() -> None:
    """A device is resolved once into a Backend, which the throttle, the parts and the integrations ask: a new
    device changes ``backends/`` alone."""
    assert kind_comparisons() == []


def test_the_kind_check_sees_each_way_to_compare_a_kind(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "backends").mkdir(parents=True)
    (root / "backends" / "torch.py").write_text("def f(kind):\n    return kind == 'cuda'\n")  # the backends' own
    (root / "parts.py").write_text(
        "_PINNED = ('cuda', 'xpu')\nON: frozenset[str] = frozenset({'hpu'})\nOTHER = ('no', 'off')\n"
        "def f(kind, device, mode):\n"
        "    a = kind == 'cuda'\n"  # 5
        "    b = 'cuda:1' != str(device)\n"
        "    c = kind not in _PINNED\n"
        "    d = kind in ON or mode in OTHER or mode == 'auto'\n"  # 8 (the rest compares no kind)
        "    e = kind in ['tpu', 'gpu']\n"
        "    match kind:\n"
        "        case 'mps' | 'meta':\n"  # 11 (the two patterns, each a MatchValue)
        "            pass\n"
        "        case 'other':\n"
        "            pass\n"
        "    f = str(device).startswith('cpu') or mode.endswith(('xla', 'x')) or mode.startswith('cu')\n"  # 15
        "    return {'cuda': 1}[kind], dict(device='cpu')\n")  # a lookup and an argument compare nothing
    assert kind_comparisons(root) == ["pkg/parts.py:5", "pkg/parts.py:6", "pkg/parts.py:7", "pkg/parts.py:8",
                                      "pkg/parts.py:9", "pkg/parts.py:11", "pkg/parts.py:11", "pkg/parts.py:15",
                                      "pkg/parts.py:15"]


MAX_LINES = 320


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: docstrings (of the module, classes and functions, read by ast),
    comments and blank lines (read by tokenize) aside; a statement over several lines counts each."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


_NOT_CODE = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                       tokenize.ENCODING, tokenize.ENDMARKER})


def test_no_module_of_the_package_holds_more_than_320_lines_of_code() -> None:
    """Small modules, one concept each: a module that outgrows the limit holds two, and splits."""
    sizes = {str(path.relative_to(PACKAGE.parent)): code_lines(path.read_text()) for path in PACKAGE.rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


THROTTLE_MAX_LINES = 200


def test_the_throttle_is_a_facade_of_at_most_200_lines_of_code() -> None:
    """``throttle.py`` holds the public signature, its docs and forwarding calls; the loop's lifecycle (passes,
    step loops, ownership, host times, close) is ``_lifecycle.Lifecycle``'s, the rule the core's."""
    assert code_lines((PACKAGE / "throttle.py").read_text()) <= THROTTLE_MAX_LINES


def test_the_line_count_leaves_out_docstrings_comments_and_blank_lines() -> None:
    source = ('"""The module\'s docstring,\non two lines."""\n\nimport os  # a comment\n\n\n'
              "class A:\n    '''A docstring.'''\n\n    x = (1,\n         2)\n    # a comment\n\n"
              "    def f(self):\n        \"\"\"Its docstring.\"\"\"\n        return '''a string\nover two lines'''\n")
    # import os, class A:, x = (1, / 2), def f, return ''' / over two lines
    assert code_lines(source) == 7


def test_every_part_is_listed_and_its_stats_are_a_base_of_the_parts_stats() -> None:
    """A public ``Part`` of a module of ``parts/`` is a part of the throttle: it has a ``PLACE``, so the command
    lists it in ``PARTS`` (built, its options checked, its lines shown) and its ``STATS`` among ``PartStats``'s
    bases (fields of ``Stats``); tests/test_declared.py holds the written file to the declarations."""
    import importlib
    import pkgutil

    from asyncthrottle import parts
    from asyncthrottle.parts._build import Part

    defined = set()
    for info in pkgutil.iter_modules(parts.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{parts.__name__}.{info.name}")
        defined |= {kind for kind in vars(module).values() if isinstance(kind, type) and issubclass(kind, Part)
                    and kind is not Part and kind.__module__ == module.__name__ and not kind.__name__.startswith("_")}
    assert defined - set(parts.PARTS) == set(), (
        "give these a PLACE, then run python -m asyncthrottle.parts._declare")
    stats = {part.STATS for part in parts.PARTS if part.STATS is not None}
    assert stats - set(parts.PartStats.__mro__) == set(), "run python -m asyncthrottle.parts._declare"


# Private names the package owns in one module and reads elsewhere on another library's object; each a reason.
FOREIGN_PRIVATES = {
    "_sleep": "torch.cuda._sleep (bench/cuda_sleep.py): torch's GPU spin, the one way to queue device time "
              "without a kernel of our own; the package's own _sleep is the wait strategies'",
}


# A module that keeps a class of its own in another module, only for the size of both: it may touch that class's
# private state, and nothing else may. Module -> (the module it is friends with, why).
FRIENDS = {
    "values.py": ("_deferred.py",
                  "Completions delivers its Deferred values: their state is written every step with deferred values, "
                  "where tests/tools/test_benchmark_scripts.py bounds the Python calls a step (a named call per "
                  "value costs 5 calls a step, measured); Deferred lives apart for the modules' size only"),
}


def _owned_privates(tree: ast.Module) -> set[str]:
    """The private (``_x``, not dunder) attributes a module's classes own: their methods, class attributes and
    ``__slots__``, and every ``self._x = ...``/``cls._x = ...``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(
                    item, ast.AnnAssign) else []
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                        if target.id == "__slots__" and isinstance(item.value, (ast.Tuple, ast.List)):
                            names.update(str(e.value) for e in item.value.elts if isinstance(e, ast.Constant))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(
                node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def reach_ins(root: Path = PACKAGE, allowed: frozenset[str] = frozenset(FOREIGN_PRIVATES),
              friends: dict[str, tuple[str, str]] | None = None) -> list[str]:
    """``file:line: expression`` for each ``x._name`` (``x`` not ``self``, ``cls`` or ``super()``; ``_name`` not a
    dunder) where ``_name`` is a private attribute that another module of the package owns and this one does not:
    an object's private state read or written across modules. Another library's private names (``sys._getframe``)
    are not the package's; a name in ``allowed`` is such a one that the package happens to own too. A module of
    ``friends`` (path under ``root`` -> the friend's path, why) owns its friend's private names too."""
    friends = FRIENDS if friends is None else friends
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(root.rglob("*.py"))}
    owned = {path: _owned_privates(tree) for path, tree in trees.items()}
    for mine, (theirs, _) in friends.items():
        owned[root / mine] = owned[root / mine] | owned[root / theirs]
    everyone = set().union(*owned.values()) - allowed
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in everyone or node.attr in owned[path]:
                continue
            value = node.value
            if (isinstance(value, ast.Name) and value.id in ("self", "cls")) or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"):
                continue
            found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_no_module_reaches_into_another_modules_private_attributes() -> None:
    """An object is changed and read through its named calls: the view and the framework callbacks drive a throttle
    through its ``Lifecycle`` (``_lifecycle.of``), a part calls the core's methods. A private attribute is its
    module's own (and a named friend's: ``FRIENDS``, each with its reason)."""
    assert reach_ins() == []


def test_the_reach_in_check_sees_a_private_read_and_write_across_modules(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "a.py").write_text(
        "class A:\n    __slots__ = ('_slot',)\n    def __init__(self):\n        self._slot = self._hidden = 1\n"
        "    def _step(self):\n        return self._slot\n"
        "class B:\n    def f(self, a):\n        return a._hidden, a._step()\n")  # the same module: its own
    (root / "b.py").write_text(
        "import sys\nfrom .a import A\nclass C(A):\n    def g(self, a):\n        a._slot = 2\n"  # 5
        "        sys._getframe(); self._hidden; super()._step(); a.__class__\n"  # none of these
        "        return a._step(), a._own\n"  # 7: _step, not _own
        "    def h(self):\n        self._own = 1\n")
    assert reach_ins(root, frozenset(), {}) == ["pkg/b.py:5: a._slot", "pkg/b.py:7: a._step"]
    assert reach_ins(root, frozenset(), {"b.py": ("a.py", "a friend")}) == []


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
# where the notifications are told by rule (tell, tell_rest, tell_all themselves)
_NOTIFY = "core/notify.py"


def hot_functions(page: Path = ARCHITECTURE) -> set[str]:
    """The hot paths that docs/architecture.md names (its "Hot paths" table: ``path`` | ``Class.function`` | ...), as
    ``path::Class.function``."""
    section = page.read_text().split("### Hot paths", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `")]
    return {f"{row[1].strip().strip('`')}::{row[2].strip().strip('`')}" for row in rows}


def _functions(tree: ast.AST) -> list[tuple[int, int, str]]:
    """Each function's first and last line and its qualified name (``Class.method``, ``f.inner``)."""
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.append((child.lineno, child.end_lineno or child.lineno, prefix + child.name))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, f"{prefix}{child.name}." if isinstance(child, ast.ClassDef) else prefix)

    visit(tree, "")
    return spans


def inlined_notifications(root: Path = PACKAGE) -> set[str]:
    """``path::Class.function`` of each function that tells a notification by hand: a loop over the hooks whose
    handler finishes it with ``tell_rest``/``tell_all`` (outside ``core/notify.py``, where ``tell`` is that loop
    once)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root))
        if name == _NOTIFY:
            continue
        tree = ast.parse(path.read_text(), str(path))
        spans = _functions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "tell_rest", "tell_all"):
                inner = [span for span in spans if span[0] <= node.lineno <= span[1]]
                found.add(f"{name}::{min(inner, key=lambda span: span[1] - span[0])[2] if inner else '<module>'}")
    return found


def test_notifications_are_inlined_only_in_the_named_hot_paths() -> None:
    """Everywhere else a notification is one ``tell(hooks, ...)`` (a call more, where it is not told every step): a
    hand-unrolled loop must be one of docs/architecture.md's hot paths, each with the figure that pays for it."""
    hot = hot_functions()
    assert inlined_notifications() - hot == set(), "tell(...) instead, or add it to the hot paths with a figure"
    functions = {f"{path.relative_to(PACKAGE)}::{span[2]}" for path in PACKAGE.rglob("*.py")
                 for span in _functions(ast.parse(path.read_text()))}
    assert hot - functions == set(), "a hot path that no longer exists: take it off the table"
    assert len(hot) <= 6


def test_the_inlined_notification_check_finds_a_hand_told_hook(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "core").mkdir(parents=True)
    (root / "core" / "notify.py").write_text("def tell(hooks):\n    tell_rest(hooks)\n")  # the rule's own
    (root / "a.py").write_text(
        "class A:\n    def hot(self, hooks):\n        try:\n            for hook in hooks:\n                hook()\n"
        "        except BaseException:\n            tell_rest(hooks, hook)\n            raise\n"
        "    def cold(self):\n        tell(self.hooks)\n")
    assert inlined_notifications(root) == {"a.py::A.hot"}
