"""Per-step charts as inline SVG, with no library: the HTML report's time strip and loss curve.

A chart plots one or more series of one value per step (None: no value at that step) against the
step. Up to :data:`POINTS` steps every step is drawn; past that the steps are cut into at most
:data:`BUCKETS` buckets and each bucket is drawn as the band from its least to its largest value,
so a spike stays as tall as it was and the page for a million steps stays small. Marked steps
(NaN/Inf losses) are drawn as bands over their buckets, never averaged away.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from html import escape

from ..plot import axis_top

__all__ = ["BUCKETS", "POINTS", "Line", "Marks", "bucket_size", "chart", "number", "reduce",
           "runs"]

# every step is drawn up to this many steps ...
POINTS = 2000
# ... past it, at most this many buckets (min and max of each)
BUCKETS = 1000
# with at most this many steps each value is also drawn as a dot
_DOTS = 60
# the picture's size in user units (the page scales it to its width)
_WIDTH, _PLOT_HEIGHT = 960, 260
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 16, 40, 46
_LEGEND_ROW = 20
# what a character of the 12-unit labels takes, to lay out the legend
_CHAR = 6.8
_MARK_COLOUR = "#cf222e"
_TEXT_COLOUR = "#1f2328"
_GRID_COLOUR = "#d0d7de"


@dataclasses.dataclass(frozen=True)
class Line:
    """One series: a value a step (None: none at that step).

    Attributes:
        label: its name in the legend.
        values: one value a step, in the chart's unit before ``scale``; NaN/Inf count as None.
        colour: a CSS colour.
        join: draw across the steps with no value (a series timed on some steps only); else
            the line breaks there.
    """

    label: str
    values: Sequence[float | None]
    colour: str
    join: bool = False


@dataclasses.dataclass(frozen=True)
class Marks:
    """Steps to mark across the plot (the NaN/Inf losses).

    Attributes:
        label: what a mark is, for the legend and each mark's tooltip ("NaN/Inf loss").
        steps: the marked steps' indices.
    """

    label: str
    steps: Sequence[int]


@dataclasses.dataclass(frozen=True)
class _Axis:
    """The value axis: ``low``..``high`` (log10 of them when ``log``), its ticks."""

    low: float
    high: float
    log: bool
    ticks: tuple[float, ...]

    def y(self, value: float) -> float:
        if self.log:
            value = math.log10(value)
        share = (value - self.low) / (self.high - self.low)
        return _TOP + _PLOT_HEIGHT * (1 - min(1.0, max(0.0, share)))


def bucket_size(steps: int) -> int:
    """How many steps one drawn point or band holds: 1 up to :data:`POINTS` steps, else enough
    for at most :data:`BUCKETS` buckets."""
    return 1 if steps <= POINTS else -(-steps // BUCKETS)


def reduce(values: Sequence[float | None], steps: int,
           size: int) -> list[tuple[float, float] | None]:
    """The least and largest finite value of each bucket of ``size`` steps (None: no finite
    value in it), over the first ``steps`` steps (values missing at the end count as None)."""
    out: list[tuple[float, float] | None] = []
    for start in range(0, steps, size):
        found = [v for v in values[start:start + size] if v is not None]
        if not math.isfinite(sum(found)):  # a NaN or an Inf in it (or a sum past 1e308)
            found = [v for v in found if math.isfinite(v)]
        out.append((min(found), max(found)) if found else None)
    return out


def runs(indices: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """The runs of consecutive numbers among sorted ``indices``: (first, last, how many
    entries of ``indices`` the run holds, repeats included)."""
    ordered = iter(indices)
    first = next(ordered, None)
    if first is None:
        return
    last, count = first, 1
    for index in ordered:
        if index > last + 1:
            yield first, last, count
            first, count = index, 0
        last, count = index, count + 1
    yield first, last, count


def chart(lines: Sequence[Line], *, steps: int, ident: str, title: str, y_label: str,
          unit: str = "", scale: float = 1.0, zero: bool = True, log: bool | None = None,
          cut: bool = False, marks: Sequence[Marks] = ()) -> str | None:
    """An ``<svg>`` of ``lines`` against the step (None: no value to draw and no mark).

    Args:
        lines: the series (each at most ``steps`` long).
        steps: the run's number of steps (the x axis).
        ident: a prefix unique in the page, for the title's and description's ids.
        title: the chart's accessible title (its ``<title>``).
        y_label: the value axis's label, with its unit.
        unit: the values' unit in tooltips and notes (``"ms"``).
        scale: what each value is multiplied by (1000: seconds drawn as ms).
        zero: the axis starts at 0 (times); else at the least value (a loss).
        log: a log10 axis; None: when the axis need not start at 0 (not ``zero``) and every
            value is positive and they span 3 decades or more.
        cut: on a linear axis, cut it above a few outliers (:func:`asyncthrottle.plot.axis_top`)
            and mark the steps above it on its edge.
        marks: steps to mark (NaN/Inf losses), drawn whatever the values.
    """
    size = bucket_size(steps)
    reduced = [reduce(line.values, steps, size) for line in lines]
    bands = [b for series in reduced for b in series if b is not None]
    marked = [m for m in marks if m.steps]
    if steps <= 0 or (not bands and not marked):
        return None
    values = [b[0] * scale for b in bands] + [b[1] * scale for b in bands]
    if log is None:
        log = not zero and bool(values) and min(values) > 0 \
            and max(values) / min(values) >= 1000
    top = _top(lines, reduced, scale) if cut and not log else None
    axis = _axis(values, zero=zero, log=log, top=top)
    x = _xs(steps, size)
    above, peaks = _above(lines, reduced, top, scale, size, x, unit) if top is not None \
        else ([], [])
    legend, legend_height = _legend(lines, marked, size, _peaks_named(peaks, unit))
    height = _TOP + _PLOT_HEIGHT + _BOTTOM + legend_height
    parts = [f'<svg class="chart" viewBox="0 0 {_WIDTH} {height}" role="img" '
             f'aria-labelledby="{ident}-t {ident}-d">',
             f'<title id="{ident}-t">{escape(title)}</title>',
             f'<desc id="{ident}-d">'
             f"{escape(_describe(lines, reduced, marked, steps, size, unit, scale))}</desc>",
             *_frame(axis, steps, y_label),
             *_marks(marked, steps, size, x)]
    for line, series in zip(lines, reduced, strict=True):
        parts += _series(line, series, axis, x, scale, size, unit, dots=steps <= _DOTS)
    parts += [*above, f'<g transform="translate(0 {_TOP + _PLOT_HEIGHT + _BOTTOM})">',
              *legend, "</g>", "</svg>"]
    return "".join(parts)


def _top(lines: Sequence[Line], reduced: list[list[tuple[float, float] | None]],
         scale: float) -> float | None:
    """Where to cut the axis (:func:`asyncthrottle.plot.axis_top`), from every value up to
    :data:`POINTS` steps; past that, from every n-th value (a sort of millions of values takes
    seconds) and each bucket's largest, so that the largest value is the true one."""
    stride = max(1, max((len(line.values) for line in lines), default=0) // (10 * POINTS))
    values = [v for line in lines for v in line.values[::stride]
              if v is not None and math.isfinite(v)]
    if stride > 1:
        values += [band[1] for series in reduced for band in series if band is not None]
    return axis_top([v * scale for v in values])


def _axis(values: list[float], *, zero: bool, log: bool, top: float | None) -> _Axis:
    """The value axis over ``values`` (cut at ``top``), with 'nice' ticks; a log10 one where
    ``log`` and every value is positive."""
    if top is not None:
        values = [min(v, top) for v in values] + [top]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if log and low > 0:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        stride = max(1, math.ceil((max(last, first + 1) - first) / 6))
        # the ends on whole strides, so that the ticks sit on them
        first, last = first - first % stride, max(last + -last % stride, first + stride)
        return _Axis(first, last, True,
                     tuple(10.0 ** k for k in range(first, last + 1, stride)))
    if zero:
        low, high = min(0.0, low), max(0.0, high)
    if high == low:
        pad = abs(high) * 0.1 or 1.0
        low, high = (low - pad, high + pad) if not zero else (low, high + pad)
    step = _nice((high - low) / 5)
    start, end = math.floor(low / step) * step, math.ceil(high / step) * step
    if top is not None:
        end = top
    ticks = tuple(start + k * step for k in range(round((end - start) / step) + 1)
                  if start + k * step <= end * (1 + 1e-9) + 1e-300)
    return _Axis(start, end, False, ticks)


def _nice(rough: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``rough``."""
    power = 10.0 ** math.floor(math.log10(rough))
    return next(k * power for k in (1, 2, 5, 10) if k * power >= rough * (1 - 1e-9))


def number(value: float) -> str:
    """``value`` short, for a tick or a tooltip: 3 significant digits (``0.0417``, ``12.3``,
    ``1.2e+06``)."""
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{value:.2g}"


def _xs(steps: int, size: int) -> list[float]:
    """Each bucket's x: its middle step, placed on the axis of steps 0..steps-1."""
    return [_step_x(min(steps - 1, start + (size - 1) / 2), steps)
            for start in range(0, steps, size)]


def _step_x(step: float, steps: int) -> float:
    width = _WIDTH - _LEFT - _RIGHT
    return _LEFT + width * step / max(1, steps - 1) if steps > 1 else _LEFT + width / 2


def _frame(axis: _Axis, steps: int, y_label: str) -> list[str]:
    """The grid, both axes with their ticks and labels."""
    right, bottom = _WIDTH - _RIGHT, _TOP + _PLOT_HEIGHT
    out = [f'<g class="axis" font-size="12" fill="{_TEXT_COLOUR}">']
    for tick in axis.ticks:
        y = axis.y(tick)
        label = number(tick) if not axis.log or 1e-2 <= tick <= 1e4 \
            else f"1e{round(math.log10(tick))}"
        out.append(f'<line x1="{_LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{_GRID_COLOUR}" stroke-width="1"/>'
                   f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f"{escape(label)}</text>")
    for tick in _step_ticks(steps):
        x = _step_x(tick, steps)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 5}" '
                   f'stroke="{_TEXT_COLOUR}"/><text x="{x:.1f}" y="{bottom + 18}" '
                   f'text-anchor="middle">{tick:,}</text>')
    middle = _TOP + _PLOT_HEIGHT / 2
    out += [f'<line x1="{_LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}" '
            f'stroke="{_TEXT_COLOUR}"/>',
            f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{bottom}" stroke="{_TEXT_COLOUR}"/>',
            f'<text x="{(_LEFT + right) / 2:.1f}" y="{bottom + 36}" text-anchor="middle">'
            "step</text>",
            f'<text transform="translate(16 {middle:.1f}) rotate(-90)" text-anchor="middle">'
            f"{escape(y_label)}</text>", "</g>"]
    return out


def _step_ticks(steps: int) -> list[int]:
    if steps <= 1:
        return [0]
    step = max(1, int(_nice((steps - 1) / 8)))
    return list(range(0, steps, step))


def _marks(marks: Sequence[Marks], steps: int, size: int, x: list[float]) -> list[str]:
    """Each run of marked buckets as a band across the plot, with a solid cap and a tooltip."""
    out = []
    half = max(1.5, (x[1] - x[0]) / 2 if len(x) > 1 else 3.0)
    for mark in marks:
        buckets = sorted(step // size for step in mark.steps if 0 <= step < steps)
        for first, last, count in runs(buckets):
            where = _span(first * size, min(steps, (last + 1) * size) - 1)
            if size > 1:
                where = f"{count:,} step{'s' if count != 1 else ''}, {where}"
            left, right = x[first] - half, x[last] + half
            out.append(f'<g><title>{escape(mark.label)} {where}</title>'
                       f'<rect x="{left:.1f}" y="{_TOP}" width="{right - left:.1f}" '
                       f'height="{_PLOT_HEIGHT}" fill="{_MARK_COLOUR}" fill-opacity="0.14"/>'
                       f'<rect x="{left:.1f}" y="{_TOP - 6}" width="{right - left:.1f}" '
                       f'height="6" fill="{_MARK_COLOUR}"/></g>')
    return out


def _span(first: int, last: int) -> str:
    """Steps ``first``..``last`` in words (``step 7``, ``steps 37-38`` with an en dash)."""
    return f"step {first:,}" if first == last else f"steps {first:,}\u2013{last:,}"


def _series(line: Line, series: list[tuple[float, float] | None], axis: _Axis, x: list[float],
            scale: float, size: int, unit: str, *, dots: bool) -> list[str]:
    """A line through the values (one step a point), or the band from each bucket's least to its
    largest value; a lone value between gaps as a dot."""
    colour = escape(line.colour)
    out = [f'<g class="series" fill="none" stroke="{colour}" stroke-width="1.6" '
           'stroke-linejoin="round">']
    known = [(k, b) for k, b in enumerate(series) if b is not None]
    groups = [known] if line.join else _contiguous(known)
    for group in groups:
        lows = [(x[k], axis.y(_positive(b[0] * scale, axis))) for k, b in group]
        highs = [(x[k], axis.y(_positive(b[1] * scale, axis))) for k, b in group]
        if len(group) == 1:
            (cx, cy), = highs
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{colour}"/>')
        elif size == 1:
            out.append(f'<path d="{_path(highs)}"/>')
        else:
            out.append(f'<path d="{_path(highs + lows[::-1])}Z" fill="{colour}" '
                       'fill-opacity="0.3" stroke-width="1"/>')
    if dots and size == 1:
        for k, b in known:
            out.append(f'<circle cx="{x[k]:.1f}" cy="{axis.y(_positive(b[1] * scale, axis)):.1f}"'
                       f' r="2.5" fill="{colour}"><title>{escape(line.label)}, step {k}: '
                       f"{number(b[1] * scale)}{' ' + unit if unit else ''}</title></circle>")
    return [*out, "</g>"]


def _positive(value: float, axis: _Axis) -> float:
    """A value a log axis can place (its least tick for 0 or less)."""
    return value if not axis.log or value > 0 else 10.0 ** axis.low


def _contiguous(known: list[tuple[int, tuple[float, float]]]
                ) -> list[list[tuple[int, tuple[float, float]]]]:
    groups: list[list[tuple[int, tuple[float, float]]]] = []
    for k, band in known:
        if groups and groups[-1][-1][0] == k - 1:
            groups[-1].append((k, band))
        else:
            groups.append([(k, band)])
    return groups


def _path(points: list[tuple[float, float]]) -> str:
    return "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _above(lines: Sequence[Line], reduced: list[list[tuple[float, float] | None]], top: float,
           scale: float, size: int, x: list[float], unit: str
           ) -> tuple[list[str], list[tuple[float, str]]]:
    """A ▲ on the axis's edge over each run of buckets with a value above the cut ``top``;
    each run's largest value and its steps in words."""
    out, peaks = ['<g class="above">'], []
    for line, series in zip(lines, reduced, strict=True):
        over = [k for k, b in enumerate(series) if b is not None and b[1] * scale > top]
        for first, last, _ in runs(over):
            peak = max(b[1] for b in series[first:last + 1] if b is not None) * scale
            where = f"{line.label}, {_span(first * size, (last + 1) * size - 1)}"
            peaks.append((peak, where))
            middle = (x[first] + x[last]) / 2
            out.append(f'<path d="M{middle - 5:.1f},{_TOP - 1}L{middle + 5:.1f},{_TOP - 1}'
                       f'L{middle:.1f},{_TOP - 10}Z" fill="{escape(line.colour)}">'
                       f"<title>above the axis: {escape(where)}: {number(peak)}"
                       f"{' ' + escape(unit) if unit else ''}</title></path>")
    return [*out, "</g>"], peaks


def _peaks_named(peaks: list[tuple[float, str]], unit: str) -> str | None:
    """The legend's note on the values above a cut axis: the largest, and how many more (one line
    of an SVG text, which does not wrap: each mark names its own in its title)."""
    if not peaks:
        return None
    peak, where = max(peaks)
    more = f" and {len(peaks) - 1} more" if len(peaks) > 1 else ""
    return f"\u25b2 above the axis: {where}: {number(peak)}{' ' + unit if unit else ''}{more}"


def _legend(lines: Sequence[Line], marks: Sequence[Marks], size: int,
            note: str | None) -> tuple[list[str], int]:
    """The legend's entries, laid out in rows under the axis (``note``: a last one, in words);
    its height."""
    entries = [(line.label, line.colour, "band" if size > 1 else "line") for line in lines]
    entries += [(mark.label, _MARK_COLOUR, "mark") for mark in marks]
    if size > 1:
        entries.append((f"band: least to largest value of each {size:,} steps", "", "note"))
    if note is not None:
        entries.append((note, "", "note"))
    out, x, row = [], float(_LEFT), 0
    for label, colour, kind in entries:
        width = 28 + _CHAR * len(label) + 18
        if x + width > _WIDTH - _RIGHT and x > _LEFT:
            x, row = float(_LEFT), row + 1
        y = row * _LEGEND_ROW + 8
        if kind == "line":
            out.append(f'<line x1="{x:.1f}" x2="{x + 22:.1f}" y1="{y}" y2="{y}" '
                       f'stroke="{escape(colour)}" stroke-width="2.5"/>')
        elif kind in ("band", "mark"):
            opacity = "0.35" if kind == "band" else "0.8"
            out.append(f'<rect x="{x:.1f}" y="{y - 6}" width="22" height="12" '
                       f'fill="{escape(colour)}" fill-opacity="{opacity}" '
                       f'stroke="{escape(colour)}"/>')
        text_x = x + (28 if kind != "note" else 0)
        out.append(f'<text x="{text_x:.1f}" y="{y + 4}" font-size="12" '
                   f'fill="{_TEXT_COLOUR}">{escape(label)}</text>')
        x += width if kind != "note" else width - 28
    return out, (row + 1) * _LEGEND_ROW + 4


def _describe(lines: Sequence[Line], reduced: list[list[tuple[float, float] | None]],
              marks: Sequence[Marks], steps: int, size: int, unit: str, scale: float) -> str:
    """The chart in words, for a screen reader."""
    said = [f"{steps:,} steps" + (f", drawn in buckets of {size:,} steps (least and largest value"
                                  " of each)" if size > 1 else "")]
    for line, series in zip(lines, reduced, strict=True):
        known = [band for band in series if band is not None]
        if known:
            low, high = min(b[0] for b in known) * scale, max(b[1] for b in known) * scale
            said.append(f"{line.label}: from {number(low)} to {number(high)}"
                        f"{' ' + unit if unit else ''}")
        else:
            said.append(f"{line.label}: no values")
    for mark in marks:
        said.append(f"{mark.label} at {len(mark.steps):,} step"
                    f"{'s' if len(mark.steps) != 1 else ''}")
    return "; ".join(said)
