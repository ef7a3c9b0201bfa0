"""Writes ``parts/_declared.py``, the listings a static type needs, from the declarations.

    python -m asyncthrottle.parts._declare           # write it
    python -m asyncthrottle.parts._declare --check   # exit 1, with the difference, when stale

A part is declared once, in its own module: its class (a ``Part`` with a ``PLACE``), its options
(``OPTIONS``) and its fields of ``Stats`` (``STATS``). Python's static types cannot gather those
from the modules (an IDE, mypy and ``help()`` read a signature and a class's bases as written),
so this writes them out, as matplotlib writes pyplot's wrappers and CPython's Argument Clinic its
parsers: ``PARTS`` in the parts' order, ``PartStats`` with each part's ``STATS`` as a base, and
``Keywords``, whose ``__init__`` is ``Throttle``'s signature (each option's type and default) and
whose docstring is its ``Args`` (each option's ``help``); ``_options.named_arguments`` wraps it, so
that a misspelt keyword is refused naming ``Throttle`` and the closest keyword.
``tests/test_declared.py`` fails while the file on disk is not what this writes. (It imports the
package, and so the file it replaces: after deleting or renaming a part, delete its lines there
first.)
"""

from __future__ import annotations

import builtins
import difflib
import importlib
import pkgutil
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .._options import CORE_OPTIONS, Option, named_arguments
from ._build import Part

PATH = Path(__file__).with_name("_declared.py")
# asyncthrottle.parts (also when run as __main__)
_PACKAGE = Part.__module__.rpartition(".")[0]
_ROOT = _PACKAGE.rpartition(".")[0]  # asyncthrottle
_WIDTH = 100
# names an option's type may use without an import of its own
_TYPING = {"Any": "typing", "Callable": "collections.abc"}
# where the core's options are declared
_CORE = CORE_OPTIONS[0].__class__.__module__


def parts() -> list[type[Part]]:
    """Every part: each class of a public module of ``parts/`` that defines a ``PLACE``, in the
    order of their places (two parts may not share one)."""
    found: dict[int, type[Part]] = {}
    package = importlib.import_module(_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_PACKAGE}.{info.name}")
        for kind in vars(module).values():
            if not (isinstance(kind, type) and issubclass(kind, Part)
                    and kind.__module__ == module.__name__ and vars(kind).get("PLACE") is not None):
                continue
            place = kind.PLACE
            if not isinstance(place, int) or isinstance(place, bool):
                raise TypeError(f"{kind.__qualname__}.PLACE must be an int, got {place!r}; e.g. "
                                "PLACE = 140 (after the parts placed before it)")
            if place in found:
                raise ValueError(f"{kind.__qualname__} and {found[place].__qualname__} share "
                                 f"PLACE = {place}; give {kind.__qualname__} a free place")
            found[place] = kind
    return [found[place] for place in sorted(found)]


def _relative(module: str) -> str:
    """``module`` as imported from ``parts/_declared.py``."""
    if module.startswith(_PACKAGE + "."):
        return "." + module[len(_PACKAGE) + 1:]
    if module == _ROOT or module.startswith(_ROOT + "."):
        return ".." + module[len(_ROOT) + 1:]
    return module


def _isort(name: str) -> tuple[int, str, str]:
    """ruff's isort order of imported names: constants, then classes, then the rest."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name.lower(), name)


def _home(value: object, found_in: str) -> str:
    """Where to import ``value`` from: a class's own module, else (a type alias) where it was
    found."""
    return value.__module__ if isinstance(value, type) else found_in


class _Imports:
    """The imports the written file needs: at run time, and for its annotations only."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.names: dict[str, set[str]] = {}
        self.typing: dict[str, set[str]] = {}

    def name(self, module: str, name: str, *, typing: bool = False) -> None:
        (self.typing if typing else self.names).setdefault(module, set()).add(name)

    def annotation(self, option: Option, owner: ModuleType) -> None:
        """The names ``option.type`` uses, found where the option is declared (else in the package's
        public names)."""
        for word in re.findall(r"[A-Za-z_]\w*", option.type):
            if hasattr(builtins, word):
                continue
            if word in _TYPING:
                self.name(_TYPING[word], word, typing=True)
                continue
            if word in vars(owner):
                home = _home(vars(owner)[word], owner.__name__)
            elif word in getattr(sys.modules[_ROOT], "__all__", ()):
                home = _home(getattr(sys.modules[_ROOT], word), _ROOT)
            else:
                raise NameError(f"option {option.name}=: its type {option.type!r} names {word}, "
                                f"which neither {owner.__name__} nor {_ROOT}'s public names "
                                f"hold; import it in {owner.__name__}")
            self.name(_relative(home), word, typing=True)

    def default(self, option: Option) -> str:
        """``option.default`` as source: a literal, or a function by its module's name."""
        value = option.default
        if isinstance(value, str) and '"' not in value:
            return f'"{value}"'
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if callable(value) and module and "." not in name and "<" not in name:
            self.modules.add(module)
            return f"{module}.{name}"
        raise TypeError(f"option {option.name}=: its default {value!r} cannot be written as "
                        "source; use a literal or a module-level function")

    def lines(self) -> list[str]:
        """The import block, sorted as ruff's isort sorts it."""
        def froms(names: dict[str, set[str]], indent: str) -> list[str]:
            # the standard library, then the package's: the further (..) before the closer (.)
            order = sorted(names, key=lambda m: (m.startswith("."), len(m.lstrip(".")) - len(m), m))
            out, previous = [], None
            for module in order:
                if previous is not None and module.startswith(".") != previous.startswith("."):
                    out.append("")
                listed = ", ".join(sorted(names[module], key=_isort))
                out.append(f"{indent}from {module} import {listed}")
                previous = module
            return out

        local = {module: names for module, names in self.names.items() if module.startswith(".")}
        stdlib = {module: names for module, names in self.names.items() if module not in local}
        head = [f"import {module}" for module in sorted(self.modules)] + froms(stdlib, "")
        lines = head + ([""] if head and local else []) + froms(local, "")
        typing = {module: names - self.names.get(module, set())
                  for module, names in self.typing.items()}
        typing = {module: names for module, names in typing.items() if names}
        if typing:
            lines += ["", "if TYPE_CHECKING:", *froms(typing, "    ")]
        return lines


def _options(declared: Sequence[type[Part]]) -> list[tuple[Option, ModuleType]]:
    """Every option with the module that declares it: the core's, then each part's in place order;
    ``depth`` first (the one positional argument) and the deprecated ones last."""
    everything = [(option, sys.modules[_CORE]) for option in CORE_OPTIONS]
    everything += [(option, sys.modules[part.__module__]) for part in declared
                   for option in part.OPTIONS]
    names = [option.name for option, _ in everything]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"options declared twice: {twice}; each keyword has one owner")
    return sorted(everything, key=lambda pair: (pair[0].name != "depth",
                                                pair[0].deprecated is not None))



def _wrapped(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + 4), break_long_words=False,
                         break_on_hyphens=False)


def text(declared: Sequence[type[Part]] | None = None) -> str:
    """What ``parts/_declared.py`` holds for these parts (default: :func:`parts`)."""
    declared = parts() if declared is None else declared
    imports = _Imports()
    imports.name("typing", "TYPE_CHECKING")
    imports.name("typing", "Any")
    imports.modules.add("dataclasses")
    # (a wrong argument is refused naming the Throttle, and the keyword closest to a misspelt one)
    imports.name(_relative(named_arguments.__module__), named_arguments.__name__)
    stats = [part.STATS for part in reversed(declared) if part.STATS is not None]
    for part in declared:
        imports.name(_relative(part.__module__), part.__name__)
    for kind in stats:
        imports.name(_relative(kind.__module__), kind.__name__)
    options = _options(declared)
    parameters, args = [], []
    for option, owner in options:
        imports.annotation(option, owner)
        parameters.append(f"        {option.name}: {option.type} = {imports.default(option)},")
        entry = option.help or option.doc
        if '"""' in entry or "\\" in entry:
            raise ValueError(f"option {option.name}=: its help cannot hold '\"\"\"' or '\\'")
        args += _wrapped(f"{option.name}: {entry}", 12)
    parameters.insert(1, "        *,")
    body = _listed("        self._open({", [f'"{option.name}": {option.name}'
                                              for option, _ in options], "})")
    out = [
        '"""The listings a static type needs, written from the parts\' declarations by',
        "``python -m asyncthrottle.parts._declare``: do not edit this file, run that.",
        "",
        "- :data:`PARTS`: every part (a class with a ``PLACE`` in a module of ``parts/``), in the",
        "  order of their places: built, subscribed and summarised in this order;",
        "- ``PartStats``: the parts' fields of ``Stats`` (each part's ``STATS``);",
        "- ``Keywords``: ``Throttle``'s keywords (``CORE_OPTIONS`` and each part's ``OPTIONS``),",
        "  with their types, defaults and docs, which an IDE and ``help(Throttle)`` show.",
        "",
        "``tests/test_declared.py`` fails while this file is not what the command writes.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *imports.lines(),
        "",
        "PARTS = (",
        *(f"    {part.__name__},  # {part.PLACE}" for part in declared),
        ")",
        "",
        "",
        "@dataclasses.dataclass(frozen=True)",
        *_listed("class PartStats(", [kind.__name__ for kind in stats], "):"),
        '    """The parts\' fields of :class:`~asyncthrottle.Stats`, the first part\'s first (a',
        '    dataclass lists the last base\'s fields first)."""',
        "",
        "",
        "class Keywords:",
        '    """The keywords of :class:`~asyncthrottle.Throttle`: its base, whose ``__init__``',
        '    takes them all and hands them to ``Throttle._open``."""',
        "",
        "    __slots__ = ()",
        "",
        "    @named_arguments",
        "    def __init__(",
        "        self,",
        *parameters,
        "    ) -> None:",
        '        """Make a throttle: check every option (a wrong type raises ``TypeError``, a',
        "        wrong value ``ValueError``, on every backend), resolve the device, build the core",
        "        and the parts the options turn on. Every option is also in the table of",
        "        docs/depth-rule.md.",
        "",
        "        Args:",
        *args,
        '        """',
        *body,
        "",
        "    def _open(self, options: dict[str, Any]) -> None:",
        '        """Build the throttle from every keyword, by name (``Throttle`` does)."""',
        "        raise NotImplementedError",
        "",
    ]
    return "\n".join(out)


def _listed(head: str, items: list[str], tail: str) -> list[str]:
    """``head`` and the comma-separated ``items``, then ``tail``, in lines of at most the width;
    the lines after the first aligned under the first item."""
    lines, line = [], head
    for index, item in enumerate(items):
        piece = item + (tail if index == len(items) - 1 else ",")
        if line.strip() and len(line) + 1 + len(piece) > _WIDTH and line != head:
            lines.append(line)
            line = " " * len(head) + piece
        else:
            line += ("" if line == head else " ") + piece
    return [*lines, line]


def main(argv: Sequence[str] | None = None) -> int:
    """Write the file, or with ``--check`` say whether it is current (exit 1 and the difference
    when not)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--check"]):
        print("usage: python -m asyncthrottle.parts._declare [--check]", file=sys.stderr)
        return 2
    wanted, have = text(), PATH.read_text() if PATH.exists() else ""
    if args:
        if wanted == have:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            have.splitlines(keepends=True), wanted.splitlines(keepends=True),
            str(PATH), "written from the declarations"))
        print(f"{PATH} is stale: run python -m asyncthrottle.parts._declare", file=sys.stderr)
        return 1
    if wanted != have:
        PATH.write_text(wanted)
        print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

