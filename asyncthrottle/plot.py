"""Draw an exported trace: host time per step, device time per sampled step, steps in flight over
time."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from ._typed import command, examples

__all__ = ["axis_top", "draw_trace", "main", "plot_trace", "summarize"]

_COLOURS = {
    "wait": "#d62728", "fetch": "#1f77b4", "body": "#2ca02c", "device": "#9467bd",
    "in flight": "#555555",
}
# the axis reaches this far above the largest step it keeps
_SLACK = 1.5
# ... and is cut only when a step left out is this many times that step (it would flatten the rest)
_FLAT = 4.0
# at most this share of steps (at least one) may lie above the axis
_OUTLIERS = 0.02


def axis_top(values: Sequence[float]) -> float | None:
    """Where to cut the value axis so that a few outliers (a warm-up step) do not flatten the rest.

    Leaves out the largest 2 % of the values (at least one) and returns 1.5
    times the largest of the others, when the largest value is over 4 times
    that one; None otherwise (nothing flattens the picture: nothing to cut).
    """
    if len(values) < 2:
        return None
    ranked = sorted(values)
    keep = ranked[len(ranked) - 1 - max(1, math.ceil(_OUTLIERS * len(ranked)))]
    return _SLACK * keep if ranked[-1] > _FLAT * keep and keep > 0 else None


def _clip(ax: Any, steps: Sequence[int], values: Sequence[float], top: float | None,
          what: str) -> None:
    """Cut ``ax`` at ``top``: mark each step above it on the edge and say which they are."""
    if top is None:
        return
    ax.set_ylim(0, top)
    over = [(v, s) for s, v in zip(steps, values, strict=True) if v > top]
    ax.plot([s for _, s in over], [top] * len(over), "^", color="black", markersize=6,
            clip_on=False)
    worst = sorted(over, reverse=True)[:3]
    named = ", ".join(f"step {s}: {v:,.1f} ms" for v, s in worst)
    more = f" and {len(over) - len(worst)} more" if len(over) > len(worst) else ""
    ax.text(0.01, 0.97, f"{what} above the axis (\u25b2): {named}{more}", transform=ax.transAxes,
            ha="left", va="top", fontsize="small",
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})


def summarize(doc: dict[str, Any]) -> dict[str, Any]:
    """Per-step host ms by span name, device ms per sampled step, and the in-flight counter (ms,
    count). A trace of several processes (``run --trace`` of a torchrun job: one a rank) gives
    its first process's (rank 0's).

    Args:
        doc: a trace written by :meth:`asyncthrottle.Throttle.export_trace`.

    Raises:
        ValueError: ``doc`` is not such a trace.
    """
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: expected a JSON object with a 'traceEvents' list")
    host: dict[str, dict[int, float]] = {"wait": {}, "fetch": {}, "body": {}}
    device: dict[int, float] = {}
    in_flight: list[tuple[float, int]] = []
    first = min((e.get("pid", 0) for e in events if e.get("ph") in ("X", "C")), default=0)
    for e in events:
        name, ph = e.get("name"), e.get("ph")
        if e.get("pid", 0) != first:
            continue
        if ph == "X" and name in host:
            step = int(e["args"]["step"])
            host[name][step] = host[name].get(step, 0.0) + e["dur"] / 1000.0
        elif ph == "X" and name == "device":
            device[int(e["args"]["step"])] = e["dur"] / 1000.0
        elif ph == "C" and name == "in flight":
            in_flight.append((e["ts"] / 1000.0, int(e["args"]["in flight"])))
    if not any(host.values()):
        raise ValueError("the trace has no asyncthrottle host spans (fetch, body, wait): is it "
                         "from export_trace()?")
    in_flight.sort()
    return {"host": host, "device": device, "in_flight": in_flight}


def plot_trace(trace: str | os.PathLike[str] | dict[str, Any], out: str | os.PathLike[str], *,
               title: str | None = None) -> None:
    """Render ``trace`` (a path or the loaded JSON) to the image file ``out``.

    Three panels: host ms per step stacked (wait, fetch, body) and device ms
    per sampled step, both against the step number, and steps in flight at
    each hand-out against host time. A few steps far above the rest (CUDA's
    warm-up in step 0) do not set the scale: the axis is cut above the others
    (:func:`axis_top`), and the steps above it are marked on its edge and named.

    Raises:
        ModuleNotFoundError: matplotlib is missing (``pip install 'asyncthrottle[plot]'``).
        ValueError: the file is not a trace written by ``export_trace()``.
    """
    if isinstance(trace, dict):
        doc = trace
    else:
        with open(trace, encoding="utf-8") as f:
            doc = json.load(f)
    draw_trace(doc, title=title).savefig(out)


def draw_trace(doc: dict[str, Any], *, title: str | None = None) -> Any:
    """The figure :func:`plot_trace` saves (a ``matplotlib.figure.Figure``), for a loaded trace."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ModuleNotFoundError("plotting needs matplotlib: pip install 'asyncthrottle[plot]' "
                                  f"({exc})", name=exc.name or "matplotlib") from exc
    data = summarize(doc)
    host, device, in_flight = data["host"], data["device"], data["in_flight"]
    steps = sorted(set().union(*host.values()))
    fig = Figure(figsize=(9, 6.4), dpi=80, layout="constrained")
    ax_host, ax_dev, ax_fly = fig.subplots(3, 1, height_ratios=(3, 2, 2))
    bottom = [0.0] * len(steps)
    # filled steps, not bars: 10,000 steps draw in a blink
    for name in ("wait", "fetch", "body"):
        top = [b + host[name].get(s, 0.0) for b, s in zip(bottom, steps, strict=True)]
        ax_host.fill_between(steps, bottom, top, step="mid", color=_COLOURS[name], label=name,
                             linewidth=0)
        bottom = top
    _clip(ax_host, steps, bottom, axis_top(bottom), "host time")
    ax_host.set_ylabel("host ms")
    ax_host.set_xlabel("step")
    ax_host.legend(loc="upper right", ncols=3, fontsize="small")
    ax_host.set_title("host time per step (stacked)", fontsize="medium", loc="left")
    if device:
        sampled = sorted(device)
        times = [device[s] for s in sampled]
        ax_dev.plot(sampled, times, ".-", color=_COLOURS["device"], markersize=4)
        ax_dev.set_ylim(bottom=0)
        _clip(ax_dev, sampled, times, axis_top(times), "device time")
        ax_dev.set_xlim(ax_host.get_xlim())
    else:
        ax_dev.text(0.5, 0.5, "no device time sampled (sample_every=None, or events without "
                              "timing)",
                    ha="center", va="center", transform=ax_dev.transAxes, fontsize="small")
    ax_dev.set_ylabel("device ms")
    ax_dev.set_xlabel("step")
    ax_dev.set_title("device time per sampled step", fontsize="medium", loc="left")
    if in_flight:
        ax_fly.step([t for t, _ in in_flight], [n for _, n in in_flight], where="post",
                    color=_COLOURS["in flight"])
        ax_fly.set_ylim(bottom=-0.2, top=max(n for _, n in in_flight) + 0.5)
    ax_fly.set_ylabel("in flight")
    ax_fly.set_xlabel("host time (ms)")
    ax_fly.set_title("steps in flight at each hand-out", fontsize="medium", loc="left")
    fig.suptitle(_heading(doc, title), fontsize="medium")
    return fig


def _heading(doc: dict[str, Any], title: str | None) -> str:
    meta = doc.get("otherData", {}).get("asyncthrottle", {})
    stats = meta.get("stats") or {}
    heading = title or "asyncthrottle trace"
    if "depth" in meta:
        heading += f" -- depth {meta['depth']}"
    if stats.get("verdict"):
        heading += f", verdict: {stats['verdict']}"
    return heading


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncthrottle plot trace.json -o timeline.png``; returns the exit status."""
    p = argparse.ArgumentParser(
        prog=command("plot"),
        description=textwrap.fill(
            "Draw a trace written by Throttle.export_trace() or run --trace: host time per step "
            "(wait, fetch, body), device time per sampled step, and steps in flight over time. "
            "Needs pip install 'asyncthrottle[plot]'.", 79),
        epilog=examples(("run --trace trace.json train.py", "a script's trace"),
                        ("plot trace.json -o timeline.png", "drawn")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="the JSON file written by export_trace()")
    p.add_argument("-o", "--output", default="timeline.png",
                   help="image to write (default timeline.png)")
    p.add_argument("--title", default=None, help="the figure's title (default: depth and verdict)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plot_trace(args.trace, args.output, title=args.title)
    except (OSError, ValueError, ImportError, KeyError, TypeError) as exc:
        print(f"error: {args.trace}: {exc}", file=sys.stderr)
        return 2
    print(f"plot saved to {args.output}")
    return 0
