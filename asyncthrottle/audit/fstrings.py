"""Which field of an f-string a ``Tensor.__format__`` read formats: a logging line such as
``print(f"epoch {epoch} step {i} loss {loss:.4f}")`` reads ``loss``, not ``epoch`` or ``i``."""

from __future__ import annotations

import dis
from types import CodeType, FrameType

__all__ = ["Fields"]

# the instructions that format an f-string's field (3.11-3.12: FORMAT_VALUE; 3.13 on: these two)
_FORMATS = frozenset({"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC"})


class Fields:
    """The field a frame formats now, by its position among the line's: each code location is
    read once (``dis``), then looked up."""

    def __init__(self) -> None:
        self._known: dict[tuple[CodeType, int], int | None] = {}

    def at(self, frame: FrameType) -> int | None:
        """The 0-based position, among the f-string fields of the frame's line (left to right,
        in the order the compiler formats them), of the field the frame is formatting; None
        where it formats none (``format(x)``, ``str.format``, a read of another kind)."""
        key = (frame.f_code, frame.f_lasti)
        if key not in self._known:
            self._known[key] = _position(*key)
        return self._known[key]


def _position(code: CodeType, offset: int) -> int | None:
    lines: dict[int, int | None] = {}  # each format instruction's line, by its offset
    line: int | None = None
    for instruction in dis.get_instructions(code):
        # the instruction's line: its position's (3.11 on), else the last line started (3.10)
        positions = getattr(instruction, "positions", None)
        if positions is not None:
            line = positions.lineno
        elif instruction.starts_line is not None:
            line = instruction.starts_line
        if instruction.opname in _FORMATS:
            lines[instruction.offset] = line
    if lines.get(offset) is None:
        return None
    return sum(1 for at, at_line in lines.items() if at < offset and at_line == lines[offset])
