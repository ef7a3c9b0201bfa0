"""The benchmark's outputs: a text table, a JSON document, and a plot of in-flight depth over
time."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from .experiments import ASYNC, ExperimentResult, ModeResult

__all__ = ["MODEL_TEXT", "Deadline", "machine", "plot_timelines", "say", "to_json", "to_text"]

MODEL_TEXT = (
    "cost model (d2l's t1, t2, t3): launch = host time to launch one step (a burst of launches, "
    "timed on the host),\n  device = device time per step (what is left to drain after the burst), "
    "sync = one sync on an idle device;\n  sync mode ~ n (launch + device + sync); async ~ launch "
    "+ n device + sync (n launch + device + sync if the host is slower);\n  depth d ~ n "
    "max(launch, device, (launch + device + sync) / d) + min(launch, device) + sync (depth 1: the "
    "sync mode)"
)

_HEADER = (
    "mode", "steps/s", "vs async", "max in flight", "host wait", "wall s", "model s", "model err",
)


class Deadline:
    """A bench's cap on its own run time: what is left of ``seconds`` since it was made.

    Args:
        seconds: the budget; None for no cap.
        clock: the time source (injected in tests).

    Example: ``cap = Deadline(args.max_s)``, then skip (and say so) whatever would start after
    ``cap.spent()``, and stop a timed loop at ``cap.at(run_s)``.
    """

    def __init__(self, seconds: float | None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.seconds, self.clock = seconds, clock
        self.start = clock()

    def left(self) -> float:
        """Seconds left (inf without a cap; never below 0)."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.seconds - (self.clock() - self.start))

    def spent(self) -> bool:
        """Whether the budget is used up."""
        return self.left() <= 0

    def at(self, seconds: float) -> float:
        """The clock reading ``seconds`` from now, or the cap's end if that comes first."""
        now = self.clock()
        return now + min(seconds, self.left())


def say(line: str = "") -> None:
    """Print one line of a bench's output at once (flushed), so a cut-short run shows what it
    measured."""
    print(line, flush=True)


def machine() -> dict[str, Any]:
    """Where the figures were measured."""
    info: dict[str, Any] = {
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": _cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def _cpu_count() -> int | None:
    import os

    return os.cpu_count()


def _row(result: ModeResult, async_rate: float) -> tuple[str, ...]:
    return (
        result.mode,
        f"{result.steps_per_s:,.0f}",
        f"{result.steps_per_s / async_rate:.3f}x",
        str(result.max_in_flight),
        f"{100 * result.wait_fraction:.1f} %",
        f"{result.wall_s:.3f}",
        f"{result.predicted_s:.3f}",
        f"{100 * result.model_error:+.1f} %",
    )


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def to_text(experiments: Sequence[ExperimentResult], header: Sequence[str] = ()) -> str:
    """The human-readable report: a header, the cost model, one table per experiment."""
    lines = [*header, MODEL_TEXT]
    for number, exp in enumerate(experiments, 1):
        c = exp.costs
        costs = f"launch {_us(c.launch_s)}, device {_us(c.device_s)}, sync {_us(c.sync_s)}"
        lines += ["", f"[{number}] {exp.title}, {exp.steps} steps: {costs}"]
        async_rate = exp.by_mode(ASYNC).steps_per_s
        rows = [_HEADER, *(_row(r, async_rate) for r in exp.results)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [
                cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)
            ]
            lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def to_json(experiments: Sequence[ExperimentResult], **context: Any) -> dict[str, Any]:
    """A JSON-ready document: ``context`` (backend, machine, ...) and every figure of every mode."""
    doc: dict[str, Any] = {**context, "experiments": []}
    for exp in experiments:
        async_rate = exp.by_mode(ASYNC).steps_per_s
        modes = [
            {
                "mode": r.mode,
                "depth": r.depth,
                "steps": r.steps,
                "wall_s": r.wall_s,
                "steps_per_s": r.steps_per_s,
                "vs_async": r.steps_per_s / async_rate,
                "max_in_flight": r.max_in_flight,
                "wait_s": r.wait_s,
                "wait_fraction": r.wait_fraction,
                "predicted_s": r.predicted_s,
                "model_error": r.model_error,
            }
            for r in exp.results
        ]
        doc["experiments"].append(
            {
                "key": exp.key, "title": exp.title, "steps": exp.steps,
                "costs": exp.costs.as_dict(), "modes": modes,
            }
        )
    return doc


def plot_timelines(experiments: Sequence[ExperimentResult], path: str, title: str = "") -> None:
    """Save a PNG: steps in flight over time, one panel per experiment, one line per mode.

    Raises:
        ImportError: matplotlib is missing (``pip install 'asyncthrottle[plot]'``).
        ValueError: the runs were not sampled (``sample=True``).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'asyncthrottle[plot]'") from None
    fig = Figure(figsize=(6.4 * len(experiments), 4.2), layout="constrained")
    axes = fig.subplots(1, len(experiments), squeeze=False)[0]
    for ax, exp in zip(axes, experiments, strict=True):
        for result in exp.results:
            if result.timeline is None:
                raise ValueError(f"mode {result.mode!r} of {exp.key!r} has no timeline; run with "
                                 "sample=True")
            times = [t for t, _ in result.timeline]
            counts = [n for _, n in result.timeline]
            ax.step(times, counts, where="post", label=result.mode, linewidth=1.2)
        ax.set_yscale("log")
        ax.set_title(f"{exp.title} ({exp.steps} steps)")
        ax.set_xlabel("seconds since the first launch")
        ax.set_ylabel("steps in flight (after each launch)")
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
