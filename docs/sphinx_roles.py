"""A griffe extension for the API reference: docstrings written for Sphinx and doctest, read as
Markdown.

The docstrings are Google style but refer to other objects the Sphinx way
(:class:`~asyncthrottle.Stats`,
:meth:`drain`). Markdown would show those roles as text, so before mkdocstrings renders a docstring
each role
becomes an autorefs link to the object it names, resolved in the docstring's own scope. The link is
optional:
a role naming an object the reference does not render (a private part) is shown as code, with no
warning.
Doctest examples (``>>>`` lines and their output) would read as nested quotes: they become ``pycon``
code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):`(~?)([^`<>]+?)(?:\(\))?`")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` means inside ``obj``'s docstring (``name`` itself when it cannot be
    resolved)."""
    head, _, rest = name.partition(".")
    scopes = [obj] + ([obj.parent] if obj.parent is not None else [])
    for scope in scopes:
        try:
            path = scope.resolve(head)
        except (griffe.NameResolutionError, KeyError, AttributeError):
            continue
        return f"{path}.{rest}" if rest else path
    return name


def _fence_doctests(text: str) -> str:
    """``text`` with each doctest (a ``>>>`` line, through the next blank line or dedent) in a
    ``pycon`` fence."""
    out: list[str] = []
    # the open doctest's indentation
    indent: str | None = None
    for line in text.split("\n"):
        if indent is not None and (not line.strip() or not line.startswith(indent)):
            out.append(f"{indent}```")
            indent = None
        if indent is None and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
        out.append(line)
    if indent is not None:
        out.append(f"{indent}```")
    return "\n".join(out)


def _rewrite(obj: griffe.Object, text: str) -> str:
    """``text`` with each Sphinx role replaced by an optional autorefs link, and its doctests
    fenced."""

    def link(match: re.Match[str]) -> str:
        short, name = match.group(1), match.group(2)
        title = name.rsplit(".", 1)[-1] if short else name
        return f'<autoref identifier="{_target(obj, name)}" optional><code>{title}</code></autoref>'

    return _ROLE.sub(link, _fence_doctests(text))


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring in a package once the whole package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg)

    def _visit(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj, obj.docstring.value)
        for member in obj.members.values():
            if isinstance(member, griffe.Object) and member.parent is obj:
                self._visit(member)
