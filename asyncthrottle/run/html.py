"""The runner's report as one self-contained HTML page (``--html PATH``), to open from a file or
attach to an issue: no script, no stylesheet, font or image fetched from anywhere (inline CSS,
inline SVG charts), built from the report's data (:func:`asyncthrottle.run.report.collect`).

The page: the verdict and its figures first (a warning where no step was found), the suggestions
with their patches, the per-step times, the loss curve with its NaN/Inf steps, the sync sites with
their source lines, the sections and input wait, the ranks' scores under torchrun, the command
that made it and the environment it ran in. A long run stays small: past a few
thousand steps the charts draw each bucket's least and largest value (:mod:`.svg`).
"""

from __future__ import annotations

import math
import os
import shlex
from html import escape
from pathlib import Path
from typing import Any

from .htmljob import collectives
from .htmljob import ranks as job_ranks
from .htmlsites import Source, cached, read_lines, syncs
from .htmlsuggestions import suggestions
from .loaders import said as loader_said
from .svg import Line, Marks, chart
from .text import GLOSSARY, duration, figure, loss_summary, nothing_found, typed

__all__ = ["render", "write"]

# the per-step series the report may hold: label and colour by key ("_s": seconds)
_PER_STEP = {"step_s": ("step time", "#0969da"), "input_wait_s": ("input wait", "#bc4c00"),
             "wait_s": ("host wait", "#8250df"), "host_wait_s": ("host wait", "#8250df"),
             "device_s": ("device time", "#1a7f37")}
_COLOURS = ("#0969da", "#bc4c00", "#1a7f37", "#8250df", "#bf3989", "#57606a", "#0a7e8c")
# verdicts that say the loop is as it should be, and those that say what to fix
_GOOD = ("device-bound",)
_FIX = ("input-bound", "host-bound", "depth-bound")

_SLOWEST = ' class="slowest"'

_STYLE = """
:root{color-scheme:light;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa;
--good:#1a7f37;--fix:#9a6700;--bad:#cf222e;--info:#0969da}
*{box-sizing:border-box}
body{margin:0;background:#fff;color:var(--fg);font:15px/1.5 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:24px 20px 48px}
h1{font-size:1.5rem;margin:0 0 4px;overflow-wrap:anywhere}
h2{font-size:1.15rem;margin:32px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
p{margin:6px 0}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,
"Liberation Mono",monospace;font-size:13px}
.muted{color:var(--muted)}
.verdict{border:1px solid var(--line);border-left:6px solid var(--info);border-radius:6px;
padding:12px 16px;margin:16px 0;background:var(--soft)}
.verdict.good{border-left-color:var(--good)}.verdict.fix{border-left-color:var(--fix)}
.verdict.warn{border-left-color:var(--bad);background:#fff5f5;border-color:#ffcecb}
.badge{display:inline-block;font-weight:600;font-size:1.1rem;padding:1px 10px;border-radius:12px;
background:var(--info);color:#fff}
.good .badge{background:var(--good)}.fix .badge{background:var(--fix)}
.warn .badge{background:var(--bad)}
ul.seen{margin:4px 0;padding-left:22px}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(120px,1fr));gap:8px;
margin:12px 0 0;padding:0}
.figures div{background:#fff;border:1px solid var(--line);border-radius:6px;padding:6px 10px}
.figures dt{font-size:12px;color:var(--muted)}.figures dd{margin:0;font-size:1.2rem;
font-weight:600;font-variant-numeric:tabular-nums;white-space:nowrap}
.figures small{display:block;font-size:12px;font-weight:400;color:var(--muted)}
.note{border:1px solid var(--line);border-left:6px solid var(--bad);border-radius:6px;
padding:8px 14px;margin:12px 0;background:#fff}
ol.suggestions li{margin:4px 0 10px}
.note.sync{border-left-color:var(--info)}
pre.diff{margin:6px 0 0;padding:6px 0;background:#fff;border:1px solid var(--line);
border-radius:4px;overflow-x:auto}
pre.diff>span{display:block;padding:0 10px;white-space:pre}
pre.diff .add{background:#dafbe1}pre.diff .del{background:#ffebe9}
pre.diff .hunk{color:var(--info)}pre.diff .file{font-weight:600}pre.diff .muted{color:var(--muted)}
svg.chart{display:block;width:100%;min-width:640px;height:auto;margin:8px 0}
.figure{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-size:13px;color:var(--muted);font-weight:600;background:var(--soft)}
td.num,th.num{text-align:right}
tbody.site td{border-bottom:none}tbody.site tr.src td{border-bottom:1px solid var(--line);
padding-top:0}
.via{display:block;color:var(--muted);font-size:12px}
pre.src{margin:0;padding:6px 0;background:var(--soft);border:1px solid var(--line);
border-radius:4px;overflow-x:auto}
pre.src>span{display:block;padding:0 10px}
pre.src .here{background:#fff8c5;box-shadow:inset 3px 0 0 var(--fix)}
pre.src .ln{display:inline-block;min-width:3.5em;color:var(--muted);user-select:none}
pre.src .ctl{color:var(--bad)}
table.environment{width:auto}table.environment th{background:none;font-size:15px;
color:var(--muted);font-weight:400;padding-right:24px}table.environment :is(th,td){
vertical-align:baseline}
.bar{display:inline-block;height:10px;background:var(--info);border-radius:2px;
vertical-align:middle}
.slowest .bar{background:var(--bad)}
.wrap{overflow-x:auto}
footer{margin-top:40px;font-size:13px;color:var(--muted)}
"""


def render(data: dict[str, Any], *, source: Source | None = None) -> str:
    """The report as one HTML page (a ``str``), from ``collect()``'s data.

    Args:
        data: the report (``--json``'s schema 1); keys that an older report lacks are left out
            of the page (``per_step``: the strip then says it has no per-step times).
        source: a file's lines by its path, for the sync sites' source lines (None: read from
            disk now; a file that cannot be read shows no lines).

    Raises:
        ValueError: ``data`` is not a schema 1 report.
    """
    if not isinstance(data, dict) or data.get("schema") != 1:
        got = f"a dict with schema {data.get('schema')!r}" if isinstance(data, dict) \
            else type(data).__name__
        raise ValueError(f"render(data=...) needs the report of asyncthrottle.run.report.collect() "
                         f"(a dict with schema 1, as --json writes it), got {got}")
    read = cached(source if source is not None else read_lines)
    script = str(data.get("script") or "")
    title = f"asyncthrottle run: {os.path.basename(script) or 'report'}"
    body = [*_head(data, title), *suggestions(data), *_per_step(data), *_losses(data),
            *syncs(data, read), *_sections(data),
            *(job_ranks(data) if "ranks" in data else _ranks(data)), *collectives(data),
            *_command(data), *_environment(data), _footer(data)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>\n")


def write(data: dict[str, Any], path: str | os.PathLike[str], *,
          source: Source | None = None) -> None:
    """Write :func:`render`'s page to ``path`` (UTF-8).

    Raises:
        OSError: ``path`` cannot be written.
        ValueError: as :func:`render`.
    """
    Path(path).write_text(render(data, source=source), encoding="utf-8")


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, (int, float)) and math.isfinite(value) else "\u2013"


def _share(part: Any, whole: float) -> str:
    return _percent(part / whole) if isinstance(part, (int, float)) and whole else "\u2013"


def _head(data: dict[str, Any], title: str) -> list[str]:
    """The title, the verdict with its advice and its figures, and the run's own problems."""
    stats = data.get("stats") or {}
    verdict = str(data.get("verdict") or "unknown")
    kind = "good" if verdict in _GOOD else "fix" if verdict in _FIX else ""
    advice = f"<p>{escape(str(data.get('advice') or ''))}</p>"
    if not data.get("steps"):
        # no verdict to give: the page warns, and says what the hooks saw
        verdict, kind = "no step found", "warn"
        said = nothing_found(data.get("seen") or {}, data.get("argv") or [],
                             data.get("raised")).strip()
        advice = f"<p>{escape(said)}</p>{_seen(data.get('seen') or {})}"
    wall = stats.get("wall_s") or 0.0
    # (name, value, a smaller note under it)
    figures: list[tuple[str, ...]] = [
        ("steps", f"{data.get('steps', 0):,}"),
        ("steps/s", figure(data.get("steps_per_s") or 0.0)),
        ("time in steps", f"{figure(wall)} s"),
        ("exit code", str(data.get("exit_code"))),
        ("host waited", _percent(stats.get("wait_fraction"))),
        ("input wait", _percent(data.get("input_wait_fraction")),
         f"{figure(data.get('input_wait_s') or 0.0)} s"),
        ("fetching", _share(stats.get("fetch_s"), wall)),
        ("loop body", _share(stats.get("body_s"), wall))]
    if stats.get("idle_fraction") is not None:
        figures.append(("device idle", _percent(stats["idle_fraction"])))
    cells = "".join(f"<div><dt>{escape(name)}</dt><dd>{escape(value)}"
                    + "".join(f' <small>{escape(more)}</small>' for more in rest)
                    + "</dd></div>" for name, value, *rest in figures)
    out = [f"<header><h1>{escape(title)}</h1>",
           f'<p class="muted mono">{escape(str(data.get("script") or ""))}</p></header>',
           f'<section class="verdict {kind}" aria-label="verdict"><p><span class="badge">'
           f"{escape(verdict)}</span></p>{advice}"
           f'<dl class="figures">{cells}</dl>{_context(data)}</section>']
    out += _guard(data)
    if data.get("error") is not None:
        out.append('<p class="note">the runner stopped finding steps after its own error: '
                   f"<code>{escape(str(data['error']))}</code></p>")
    return out


# what the hooks saw (the report's "seen"), by key
_SEEN = {"forwards": "training forwards", "backwards": "backward() calls",
         "optimizer_steps": "optimizer steps", "autograd_grad": "torch.autograd.grad calls",
         "other_threads": "backward() or step() calls on other threads",
         "processes": "processes the script started"}


def _seen(seen: dict[str, Any]) -> str:
    """What the hooks saw, where no step was found: one count each."""
    items = "".join(f"<li>{escape(str(count))} {escape(_SEEN.get(key, key.replace('_', ' ')))}"
                    "</li>" for key, count in seen.items())
    return f'<p>What the hooks saw:</p><ul class="seen">{items}</ul>' if items else ""


def _guard(data: dict[str, Any]) -> list[str]:
    """``--max-syncs-per-step``'s outcome, where the run had it."""
    outcome, limit = data.get("guard"), data.get("max_syncs_per_step")
    if outcome is None or not isinstance(limit, (int, float)):
        return []
    head = f"<code>--max-syncs-per-step {limit:g}</code>"
    if outcome == "passed":
        return [f'<p class="muted">{head}: passed (no line in the steps reads device values more '
                f"than {limit:g} times a step)</p>"]
    over = data.get("over_limit") or []
    why = {"no_steps": "no training step found, so its syncs per step cannot be judged",
           "not_counted": "the reads were not counted, so they cannot be judged"}.get(
        str(outcome), f"{len(over)} line{'s' if len(over) != 1 else ''} over the limit")
    items = "".join(f"<li><code>{escape(str(row.get('site')))}</code> reads "
                    f"<code>{escape(str(row.get('call')))}</code> "
                    f"{row.get('per_step') or 0.0:.2f} times a step</li>" for row in over)
    return [f'<div class="note"><p>{head}: <strong>FAILED</strong>: {escape(why)}</p>'
            + (f"<ul>{items}</ul>" if items else "") + "</div>"]


def _context(data: dict[str, Any]) -> str:
    """The loader and the framework, where the report has them."""
    said = []
    loader = data.get("loader")
    if isinstance(loader, dict):
        said.append(f"<code>{escape(loader_said(loader))}</code>")
    if data.get("framework"):
        said.append(f"steps found by {escape(str(data['framework']))}'s callback")
    return f'<p class="muted">{"; ".join(said)}</p>' if said else ""


def _per_step(data: dict[str, Any]) -> list[str]:
    """The strip of each step's times: whichever series the report holds."""
    out = ['<h2 id="per-step">Time per step</h2>']
    steps = int(data.get("steps") or 0)
    found = data.get("per_step")
    series = {k: v for k, v in found.items() if isinstance(v, list)} \
        if isinstance(found, dict) else {}
    if not series:
        return [*out, '<p class="muted">this report has no per-step times.</p>']
    extra = iter(_COLOURS[3:])
    lines = []
    for key, values in series.items():
        label, colour = _PER_STEP.get(key) or (key.removesuffix("_s").replace("_", " "),
                                               next(extra, "#57606a"))
        lines.append(Line(label, values, colour, join=True))
    largest = max((max(filter(_finite, values), default=0.0) for values in series.values()),
                  default=0.0)
    unit, scale = ("ms", 1000.0) if largest < 2 else ("s", 1.0)
    svg = chart(lines, steps=steps, ident="strip", title="Time per step", unit=unit,
                scale=scale, y_label=f"time ({unit})", cut=True)
    if svg is None:
        return [*out, '<p class="muted">no step was timed.</p>']
    cut = (" A few steps far above the rest (a warm-up) do not set the axis: they are marked "
           "\u25b2 on its top edge.") if "\u25b2" in svg else ""
    return [*out, f'<div class="figure">{svg}</div>',
            '<p class="muted">The host time of each step and its wait for its batch (the '
            f"loader's <code>next()</code>).{cut}</p>"]


def _losses(data: dict[str, Any]) -> list[str]:
    """The loss curve (each optimizer's, with several), its NaN/Inf steps marked."""
    out = ['<h2 id="loss">Loss</h2>']
    steps = int(data.get("steps") or 0)
    several = data.get("losses_by_optimizer") or {}
    ends = data.get("nonfinite_by_optimizer") or {}
    if several:
        series = {str(name): (values, (ends.get(name) or {}).get("nonfinite") or [],
                              (ends.get(name) or {}).get("last_nonfinite"))
                  for name, values in several.items()}
    else:
        series = {"loss": (data.get("losses") or [], data.get("nonfinite") or [],
                           data.get("last_nonfinite"))}
    lines = [Line(name, values, _COLOURS[k % len(_COLOURS)])
             for k, (name, (values, _, _)) in enumerate(series.items())]
    bad = sorted({s for _, nonfinite, _ in series.values() for s in nonfinite})
    svg = chart(lines, steps=steps, ident="loss", title="Loss per step", y_label="loss",
                zero=False, cut=True, marks=[Marks("NaN/Inf loss", bad)])
    if svg is not None:
        out.append(f'<div class="figure">{svg}</div>')
    said = [(f"{escape(name)}: " if several else "")
            + escape(loss_summary(values, nonfinite, ended))
            for name, (values, nonfinite, ended) in series.items()]
    return [*out, *(f"<p>{s}</p>" for s in said)]


def _sections(data: dict[str, Any]) -> list[str]:
    """The median time of each section a step, and the input wait."""
    out = ['<h2 id="sections">Sections</h2>']
    sections = data.get("sections") or {}
    timed = {name: ms for name, ms in sections.items() if ms is not None}
    largest = max(timed.values(), default=0.0) or 1.0
    rows = "".join(
        f"<tr><td>{escape(str(name))}</td><td class=\"num\">"
        + (escape(duration(ms)) if ms is not None else "\u2013") + "</td><td>"
        + (f'<span class="bar" style="width:{max(1.0, 100 * ms / largest):.0f}%"></span>'
           if ms is not None else "") + "</td></tr>"
        for name, ms in sections.items())
    if rows:
        out.append('<table aria-label="median time per step of each section"><thead><tr>'
                   '<th>section</th><th class="num">median per step</th><th style="width:50%">'
                   f"</th></tr></thead><tbody>{rows}</tbody></table>")
    else:
        out.append('<p class="muted">no section timed</p>')
    wait = data.get("input_wait_s") or 0.0
    out.append(f"<p>input wait: {figure(wait)} s ({_percent(data.get('input_wait_fraction'))} "
               "of the time in steps): the loop thread's time in its DataLoader's "
               "<code>next()</code></p>")
    return out


def _ranks(data: dict[str, Any]) -> list[str]:
    """Under torchrun: each rank's speed against the fastest, the slowest marked."""
    stats = data.get("stats") or {}
    scores = stats.get("rank_scores")
    if not isinstance(scores, list):
        numbered = sorted((int(key.rpartition("_")[2]), value) for key, value in stats.items()
                          if key.startswith("rank_score_") and key.rpartition("_")[2].isdigit())
        scores = [value for _, value in numbered] or None
    if not scores:
        return []
    slowest = stats.get("slowest_rank")
    rows = "".join(
        f'<tr{_SLOWEST if rank == slowest else ""}><td>{rank}'
        + (" (slowest)" if rank == slowest else "") + '</td><td class="num">'
        + (f"{score:.2f}" if score is not None else "\u2013") + "</td><td>"
        + (f'<span class="bar" style="width:{max(1.0, 100 * min(1.0, score)):.0f}%"></span>'
           if score is not None else "") + "</td></tr>"
        for rank, score in enumerate(scores))
    return ['<h2 id="ranks">Ranks</h2><p class="muted">Each rank\'s speed against the fastest '
            "(1.00: the fastest), from its forward and optimizer sections.</p>"
            '<table aria-label="rank scores"><thead><tr><th>rank</th><th class="num">score</th>'
            f'<th style="width:50%"></th></tr></thead><tbody>{rows}</tbody></table>']


def _command(data: dict[str, Any]) -> list[str]:
    """The command that made the report, where its trace went."""
    argv = [str(a) for a in data.get("argv") or []]
    options = data.get("options")
    line = shlex.join([*(str(a) for a in options or []), *argv])
    out = ['<h2 id="command">Command</h2>',
           f"<pre class=\"mono\">{escape(typed(data))} run {escape(line)}</pre>"]
    if options is None:
        # a report older than its "options"
        out.append('<p class="muted">(run\'s own options, such as <code>--json</code> or '
                   "<code>--depth</code>, are not in this report)</p>")
    trace = data.get("trace")
    if isinstance(trace, dict) and trace.get("written"):
        path = str(trace.get("path"))
        out.append(f"<p>the trace: <code>{escape(path)}</code> (<code>{escape(typed(data))} "
                   f"plot {escape(shlex.quote(path))}</code>)</p>")
    return out


def _environment(data: dict[str, Any]) -> list[str]:
    """Where the run ran, for a bug report: date, Python, torch, device, OS, asyncthrottle,
    rank and world size."""
    head = '<h2 id="environment">Environment</h2>'
    found = data.get("environment")
    if not isinstance(found, dict):
        return [head, '<p class="muted">this report has none (it is older than its '
                "environment)</p>"]

    def known(key: str) -> str:
        value = found.get(key)
        return "\u2013" if value is None or value == "" else str(value)

    device = (known("device") if found.get("device") else "\u2013 (no step found one)") + (
        f" ({found['device_name']})" if found.get("device_name") else "")
    rows = (("date", known("date")), ("Python", known("python")), ("torch", known("torch")),
            ("device", device), ("OS", known("os")), ("asyncthrottle", known("asyncthrottle")),
            ("rank", f"{known('rank')} of {known('world_size')}"))
    cells = "".join(f"<tr><th>{escape(label)}</th><td class=\"mono\">{escape(value)}</td></tr>"
                    for label, value in rows)
    return [head, f'<table class="environment" aria-label="environment"><tbody>{cells}</tbody>'
                  "</table>"]


def _footer(data: dict[str, Any]) -> str:
    from .. import __version__

    return (f"<footer>page made by asyncthrottle {escape(__version__)}, report schema "
            f"{escape(str(data.get('schema')))}; the report's words are defined in the glossary "
            f"of &ldquo;Diagnose a script&rdquo; in asyncthrottle's documentation "
            f"(<code>{escape(GLOSSARY)}</code>)</footer>")
