"""Unified diffs of a file's lines made from the edits that change them (no matching of lines, as
``difflib`` would do over the whole file): the cost of a diff is its edits and their context, not
the file's length, so a report can show each of many suggestions its own diff."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["Edit", "merged", "unified"]

# an edit: (start, rank, new lines, end): lines start:end replaced (an insert: end == start); the
# edits at one place go by rank
Edit = tuple[int, int, list[str], int]
# a run of the diff: (tag, i1, i2, j1, j2, the new lines of a change; None where equal)
_Code = tuple[str, int, int, int, int, "list[str] | None"]
_ENDS = ("\n", "\r")


def merged(lines: Sequence[str], edits: Sequence[Edit], nl: str) -> list[str]:
    """``lines`` with the edits made (a last line with no line end gets ``nl`` where lines are
    added after it).

    Raises:
        ValueError: two edits overlap.
    """
    out: list[str] = []
    done = 0
    for at, end, new in _blocks(lines, edits, nl):
        out += lines[done:at]
        out += new
        done = end
    out += lines[done:]
    return out


def _blocks(lines: Sequence[str], edits: Sequence[Edit], nl: str) -> Iterator[tuple[int, int,
                                                                                 list[str]]]:
    """The edits as changed runs of lines, ``(start, end, new lines)``, in order, the edits that
    touch made one run; lines added after a last line with no line end replace it with it
    ended."""
    run: tuple[int, int, list[str]] | None = None
    for start, _, new, end in sorted(edits, key=lambda edit: (edit[0], edit[1])):
        if start == end and not new:
            continue
        ended = run is not None and run[1] == len(lines)  # the last line replaced already
        if start == len(lines) and lines and not lines[-1].endswith(_ENDS) and not ended:
            start, new = start - 1, [lines[-1] + nl, *new]
        if run is not None and start < run[1]:
            raise ValueError(f"overlapping edits at line {start + 1}")
        if run is not None and start == run[1]:
            run = (run[0], end, run[2] + new)
            continue
        if run is not None:
            yield run
        run = (start, end, list(new))
    if run is not None:
        yield run


def unified(lines: Sequence[str], edits: Sequence[Edit], nl: str, names: tuple[str, str],
            context: int) -> str:
    """The unified diff of ``lines`` and ``lines`` with ``edits`` made, between the files
    ``names`` (``a/FILE``, ``b/FILE``), with ``context`` lines around each change: as
    ``difflib.unified_diff`` writes it (a line with no line end is followed by ``\\ No newline
    at end of file``), ``""`` where the edits change nothing."""
    codes = _codes(lines, list(_blocks(lines, edits, nl)))
    out = []
    for group in _grouped(codes, context):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, _, _, new in group:
            if tag == "equal":
                out += [f" {line}" for line in lines[i1:i2]]
                continue
            out += [f"-{line}" for line in lines[i1:i2]]
            out += [f"+{line}" for line in new or ()]
    if not out:
        return ""
    text = [f"--- {names[0]}\n", f"+++ {names[1]}\n", *out]
    return "".join(line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n"
                   for line in text)


def _codes(lines: Sequence[str], blocks: list[tuple[int, int, list[str]]]) -> list[_Code]:
    """The runs of equal and changed lines, as ``difflib.SequenceMatcher.get_opcodes()`` gives
    them (with each change's new lines)."""
    codes: list[_Code] = []
    i = j = 0
    for start, end, new in blocks:
        if start > i:
            codes.append(("equal", i, start, j, j + start - i, None))
            j += start - i
        tag = "replace" if end > start and new else "delete" if end > start else "insert"
        codes.append((tag, start, end, j, j + len(new), new))
        i, j = end, j + len(new)
    if i < len(lines):
        codes.append(("equal", i, len(lines), j, j + len(lines) - i, None))
    return codes


def _grouped(codes: list[_Code], n: int) -> Iterator[list[_Code]]:
    """The changes grouped into hunks with ``n`` lines of context, as
    ``difflib.SequenceMatcher.get_grouped_opcodes(n)`` groups them."""
    if not any(code[0] != "equal" for code in codes):
        return
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2, _ = codes[0]
        codes[0] = (tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2, None)
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2, _ = codes[-1]
        codes[-1] = (tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n), None)
    group: list[_Code] = []
    for tag, i1, i2, j1, j2, new in codes:
        if tag == "equal" and i2 - i1 > 2 * n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n), None))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2, new))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _range(start: int, stop: int) -> str:
    """A hunk's range, as ``difflib`` writes it: ``START`` for one line, else ``START,LENGTH``
    (an empty range starts a line before)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"
