"""The HTML page's suggestions (see :mod:`.html`): each with the diff of its certain rewrite, and
the ``--suggest`` command that writes them all as one patch, or applies it."""

from __future__ import annotations

from html import escape
from typing import Any

from .text import new_rows, patch_said, suggested

__all__ = ["suggestions"]


def suggestions(data: dict[str, Any]) -> list[str]:
    """The suggestions, each with the diff of its certain rewrite (its hunks not shown above),
    and the ``--suggest`` command that writes them all as one patch, or applies it."""
    head = '<h2 id="suggestions">Suggestions</h2>'
    said = suggested(data)
    if not said:
        why = ("no step was found, so nothing is suggested (see above)" if not data.get("steps")
               else "none: no read in most steps, no slow loader")
        return [f'{head}<p class="muted">{why}</p>']
    shown: set[str] = set()
    items = "".join(f"<li>{escape(line)}"
                    + (_diff(new_rows(diff, shown)) if diff is not None else "") + "</li>"
                    for line, diff in said)
    out = [f'{head}<ol class="suggestions">{items}</ol>']
    patch = patch_said(data)
    if patch is not None:
        before, command, after = patch
        out.append(f"<p>{escape(before)}" + (f"<code>{escape(command)}</code>" if command else "")
                   + f"{escape(after)}</p>")
    return out


# a diff's line's class by its first character ("@": a hunk's head; "(": a line of run's own)
_DIFF = {"+": "add", "-": "del", "@": "hunk", "(": "muted"}


def _diff_class(row: str) -> str:
    if row.startswith(("--- a/", "+++ b/")):
        return "file"
    return _DIFF.get(row[:1], "ctx")


def _diff(rows: list[str]) -> str:
    """A rewrite's diff: its added lines green, its removed lines red."""
    spans = "".join(f'<span class="{_diff_class(row)}">{escape(row) or " "}</span>'
                    for row in rows)
    return f'<pre class="diff" aria-label="the rewrite as a diff">{spans}</pre>'
