"""The package's architecture rules, read from its source: no import circle at run time."""

from __future__ import annotations

import ast
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


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: at the top, in functions, in ``try``; not under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _ancestors(name: str) -> set[str]:
    return {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules its run-time imports execute (a relative import resolved; ``from p import m``
    is both ``p`` and ``p.m``; a module's parent packages run before it, so its own are left out)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
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
