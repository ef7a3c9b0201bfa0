"""The page's part of a torchrun job: a strip of each rank's step time by phase, the straggler
with its phase, the ranks that never reported, and the script's collectives."""

from __future__ import annotations

from html import escape
from typing import Any

from .jobtext import ranks_of

__all__ = ["collectives", "ranks"]

# a rank's phases in a step's order, and their colours in the strip
_PHASES = {"forward": "#0969da", "backward": "#8250df", "optimizer": "#1a7f37",
           "input": "#bc4c00"}


def ranks(data: dict[str, Any]) -> list[str]:
    """Each rank's median step as a strip of its phases (the same scale for all), the straggler
    marked and named with its phase."""
    rows = data["ranks"]
    found = data.get("straggler")
    widest = max((sum(_timed(row).values()) for row in rows), default=0.0) or 1.0
    body = "".join(_row(row, widest, found) for row in rows)
    key = " ".join(f'<span class="bar" style="width:12px;background:{colour}"></span> {name}'
                   for name, colour in _PHASES.items())
    gone = "".join(f"<li>rank {gone['rank']}: {escape(gone['ended'])}</li>"
                   for gone in data.get("missing_ranks") or [])
    return [f'<h2 id="ranks">Ranks ({data["world_size"]})</h2>', f"<p>{_straggler(found)}</p>",
            f'<p class="muted">median ms a step of each phase (input: the wait for the loader); '
            f"{key}</p>",
            '<div class="wrap"><table aria-label="step time per rank"><thead><tr><th>rank</th>'
            '<th>host</th><th class="num">steps</th><th class="num">steps/s</th>'
            '<th class="num">median step</th><th style="width:45%">phases</th>'
            f"<th>exit</th></tr></thead><tbody>{body}</tbody></table></div>",
            *([f"<p>no report from:</p><ul>{gone}</ul>"] if gone else [])]


def _timed(row: dict[str, Any]) -> dict[str, float]:
    return {name: row["sections"][name] for name in _PHASES
            if row["sections"].get(name) is not None}


def _row(row: dict[str, Any], widest: float, found: dict[str, Any] | None) -> str:
    slow = found is not None and found["rank"] == row["rank"]
    strip = "".join(f'<span class="bar" title="{name} {ms:.3g} ms" style="border-radius:0;'
                    f'width:{100 * ms / widest:.1f}%;background:{_PHASES[name]}"></span>'
                    for name, ms in _timed(row).items())
    step = row["step_s_median"]
    mark = ' class="slowest"' if slow else ""
    return (f'<tr{mark}><td>{row["rank"]}'
            f'{" (straggler)" if slow else ""}</td><td>{escape(str(row["host"]))}</td>'
            f'<td class="num">{row["steps"]}</td><td class="num">{row["steps_per_s"]:.3g}</td>'
            f'<td class="num">{"" if step is None else f"{step * 1000:.3g} ms"}</td>'
            f'<td style="white-space:nowrap">{strip}</td><td>{row["exit_code"]}</td></tr>')


def _straggler(found: dict[str, Any] | None) -> str:
    if found is None:
        return ("No straggler: the ranks are even (no rank's own work a step exceeds the others' "
                "by 10% of the step).")
    return (f"<strong>Straggler: rank {found['rank']}</strong>, slow in its "
            f"<strong>{escape(found['phase'])}</strong>: the other ranks wait for it "
            f"{found['cost_fraction']:.0%} of the job's step time.")


def collectives(data: dict[str, Any]) -> list[str]:
    """The script's collectives: one row a line and call."""
    rows = data.get("collectives")
    if rows is None:
        return []
    if not rows:
        return ['<h2 id="collectives">Collectives</h2><p class="muted">none called by the script '
                "(DDP's own all-reduces are in the backward)</p>"]
    body = "".join(
        f"<tr><td><code>{escape(row['site'])}</code></td><td><code>{escape(row['call'])}</code>"
        + (f'<span class="via">in {escape(row["via"])}</span>' if row.get("via") else "")
        + f'</td><td class="num">{row["count"]}</td><td class="num">{row["per_step"]:.2f}</td>'
        f'<td class="num">{row["blocked_s"] * 1000:.3g} ms</td>'
        f"<td>{'in steps' if row['in_step'] else 'outside steps'}"
        f"{', only logged' if row.get('only_logged') else ''}{escape(ranks_of(row))}</td></tr>"
        for row in rows)
    return ['<h2 id="collectives">Collectives</h2>',
            '<table aria-label="the script\'s collectives"><thead><tr><th>site</th><th>call</th>'
            '<th class="num">count</th><th class="num">per step</th><th class="num">blocked</th>'
            f"<th></th></tr></thead><tbody>{body}</tbody></table>"]
