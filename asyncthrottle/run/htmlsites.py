"""The HTML page's sync-site table: each site with its source lines (see :mod:`.html`)."""

from __future__ import annotations

import re
import tokenize
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from .jobtext import ranks_of
from .text import blocked_per_step, duration, no_syncs, synchronous_note

__all__ = ["Source", "cached", "lines_of", "read_lines", "syncs"]

# a file's lines by its path (None: it cannot be read)
Source = Callable[[str], "Sequence[str] | None"]
# the sync table shows at most this many sites (the JSON keeps them all)
_SITES = 200
# the source lines shown before and after a site's line
_BEFORE, _AFTER = 2, 1
_HERE = ' class="here"'


def read_lines(path: str) -> list[str] | None:
    """A source file's lines, in its declared encoding, numbered as Python numbers them (None: it
    cannot be read)."""
    try:
        with tokenize.open(path) as f:
            return lines_of(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def lines_of(text: str) -> list[str]:
    """``text``'s lines as Python counts them: ended by ``\\n``, ``\\r\\n`` or ``\\r`` only
    (``str.splitlines()`` also ends one at a form feed, ``\\v``, ``\\x1c``-``\\x1e``,
    ``\\x85``, U+2028 and U+2029, which Python's line numbers do not count)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def cached(read: Source) -> Source:
    """``read``, each file read once a page."""
    seen: dict[str, Sequence[str] | None] = {}

    def cached(path: str) -> Sequence[str] | None:
        if path not in seen:
            seen[path] = read(path)
        return seen[path]
    return cached


def syncs(data: dict[str, Any], read: Source) -> list[str]:
    """The sync sites: each with its source lines, call, counts, in or outside the steps."""
    out = ['<h2 id="syncs">Sync sites</h2>']
    syncs = data.get("syncs")
    if syncs is None:
        return [*out, '<p class="muted">not counted (asyncthrottle.audit.syncsites is not '
                "available)</p>"]
    if not syncs:
        return [*out, f'<p class="muted">{escape(no_syncs(data.get("seen") or {}))}</p>']
    rows = sorted(syncs, key=lambda row: (not row.get("in_step"), -(row.get("per_step") or 0)))
    blocked = any(row.get("blocked_s") is not None for row in rows)
    head = ("<tr><th>site</th><th>call</th><th class=\"num\">count</th>"
            "<th class=\"num\">per step</th><th>where</th>"
            + ("<th class=\"num\">time blocked a step</th>" if blocked else "") + "</tr>")
    bodies = [_site(row, read, blocked) for row in rows[:_SITES]]
    note = synchronous_note(data)
    out += ['<p class="muted">Each line of the script that reads a device value on the host: on '
            "an accelerator each such read waits for the device.</p>",
            *([f'<p class="note sync">{escape(note[:1].upper() + note[1:])}.</p>'] if note
              else []),
            f'<div class="wrap"><table><thead>{head}</thead>{"".join(bodies)}</table></div>']
    if len(rows) > _SITES:
        out.append(f'<p class="muted">\u2026 and {len(rows) - _SITES} more sites (all in '
                   "--json)</p>")
    return out


def _site(row: dict[str, Any], read: Source, blocked: bool) -> str:
    via = row.get("via")
    call = escape(str(row.get("call"))) + (f'<span class="via">in {escape(str(via))}</span>'
                                           if via else "")
    where = ("in steps" if row.get("in_step") else "outside steps") + escape(ranks_of(row))
    cells = [f'<td class="mono">{escape(str(row.get("site")))}</td>',
             f'<td class="mono">{call}</td>',
             f'<td class="num">{row.get("count", 0):,}</td>',
             f'<td class="num">{row.get("per_step") or 0.0:.2f}</td>', f"<td>{where}</td>"]
    if blocked:
        cells.append(f'<td class="num">{_blocked(row)}</td>')
    lines = _excerpt(row, read)
    columns = len(cells)
    src = (f'<tr class="src"><td colspan="{columns}">{lines}</td></tr>' if lines else
           f'<tr class="src"><td colspan="{columns}" class="muted">source not found</td></tr>')
    return f'<tbody class="site"><tr>{"".join(cells)}</tr>{src}</tbody>'


def _blocked(row: dict[str, Any]) -> str:
    """A row's time blocked as the text says it, a step, with its total beside it."""
    seconds, each = row.get("blocked_s"), row.get("blocked_per_step_s")
    if seconds is None:
        return "\u2013"
    total = escape(duration(seconds * 1000))
    if each is None or not row.get("in_step", True):
        # (a read outside the steps blocked no step: its total alone)
        return f"{total} in all"
    return f'{escape(blocked_per_step(each))}<span class="via">{total} in all</span>'


def _excerpt(row: dict[str, Any], read: Source) -> str:
    """The site's line with a line or two around it, numbered (empty: no file, no line)."""
    file, site = row.get("file"), str(row.get("site") or "")
    number = site.rpartition(":")[2]
    if not file or not number.isdigit():
        return ""
    lines = read(str(file))
    line = int(number)
    if not lines or not 1 <= line <= len(lines):
        return ""
    first, last = max(1, line - _BEFORE), min(len(lines), line + _AFTER)
    shown = [lines[k - 1].expandtabs(4) for k in range(first, last + 1)]
    indent = min((len(s) - len(s.lstrip()) for s in shown if s.strip()), default=0)
    spans = "".join(f'<span{_HERE if k == line else ""}><span class="ln">{k}</span>'
                    f"{_visible(text[indent:])}</span>"
                    for k, text in zip(range(first, last + 1), shown, strict=True))
    return f'<pre class="src" aria-label="{escape(site)}">{spans}</pre>'


# the characters a source line may hold that show as nothing, or break the line on the page
_UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029]")


def _visible(text: str) -> str:
    """``text`` escaped for HTML, its control characters and line separators written as Python
    escapes (``\\x0c``)."""
    return _UNSEEN.sub(lambda found: f'<span class="ctl">{repr(found[0])[1:-1]}</span>',
                       escape(text))
