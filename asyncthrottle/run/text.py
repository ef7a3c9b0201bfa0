"""The runner's report as text: what is printed on stderr at the script's exit."""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from typing import Any

from .guard import GUARD_EXIT, NO_STEPS, OVER_LIMIT, PASSED
from .jobtext import collective_lines, job_lines, ranks_of
from .loaders import said as loader_said

__all__ = ["GLOSSARY", "text"]

# where the report's words are defined: the glossary of the docs' "Diagnose a script" page
GLOSSARY = "docs/run.md#glossary"

# the text shows at most this many sync sites and suggestions (the JSON keeps them all)
_SHOWN = 20
# ...and this many lines of a suggestion's diff (--suggest writes them all)
_DIFF_SHOWN = 20


def text(data: dict[str, Any], *, rank: tuple[int, int] | None = None,
         slowest: Any = None) -> str:
    """The report as printed on stderr (a torchrun job's: rank 0's lines, then the ranks')."""
    who = f" (rank {rank[0]} of {rank[1]})" if rank is not None else ""
    if "ranks" in data:
        who = f" (the job of {data['world_size']} ranks; rank 0's figures first)"
    stats = data["stats"]
    lines = [f"asyncthrottle run{who}: {data['script']}: {data['steps']} steps in "
             f"{stats.get('wall_s', 0.0):.2f} s ({figure(data['steps_per_s'])} steps/s), exit "
             f"code {data['exit_code']}"]
    if data["steps"] == 0:
        lines.append(nothing_found(data.get("seen") or {}, data["argv"], data.get("raised")))
    if data["error"] is not None:
        lines.append(f"  the runner stopped finding steps after its own error: {data['error']}")
    if data["steps"]:
        lines += _verdict(data, stats) + _losses(data) + _sections(data)
        if data.get("loader") is not None:  # as the script wrote it, what torch runs beside it
            lines.append(f"  loader: {loader_said(data['loader'])}")
    if slowest is not None:
        lines.append(f"  slowest rank: {slowest}")
    if "ranks" in data:
        lines += job_lines(data)
    lines += _sync_lines(data["syncs"], data.get("seen") or {})
    note = synchronous_note(data)
    lines += [f"  {note}"] if note else []
    lines += collective_lines(data.get("collectives"))
    lines += _suggestions(data)
    lines += _trace(data)
    lines.append(f"  the report's words: {GLOSSARY} (\"Diagnose a script\" in the docs)")
    lines += _guard(data)  # last: what a CI log shows
    return "\n".join(lines)


def nothing_found(seen: dict[str, int], argv: Sequence[str],
                  raised: dict[str, Any] | None = None) -> str:
    """Why no step was found: the script did not start, or raised before any step; then what the
    hooks saw."""
    if raised is not None and not raised["started"]:
        return f"  the script did not start{_raised(raised, ':', '')} (0 steps)"
    why = [f"the script raised{_raised(raised, '', ' before any step')}"] if raised else []
    if seen.get("other_threads"):
        why.append(f"{_times(seen['other_threads'], 'backward() or optimizer step() call')} ran "
                   "on other threads (run hears only the main thread)")
    if seen.get("autograd_grad") and not seen.get("backwards"):
        why.append(f"torch.autograd.grad was called {_times(seen['autograd_grad'], 'time')} (no "
                   "backward())")
    if seen.get("processes"):
        count = seen["processes"]
        why.append(f"the script started {_times(count, 'process', 'es')} (mp.spawn, "
                   "multiprocessing), whose steps run does not hear: run each under run, e.g. "
                   f"torchrun --nproc-per-node={count} -m asyncthrottle run {shlex.join(argv)} "
                   "with the script starting no processes of its own")
    if jax_only(seen):
        why.append(JAX)
    where = " on the main thread" if seen.get("other_threads") else ""
    return f"  no training step found{where}: {'; '.join(why or [_main_thread(seen)])} (0 steps)"


# what a JAX script is told (run's hooks and audit hear PyTorch only)
JAX = ("the script imported JAX, and run hears PyTorch only (its steps, losses and reads): for a "
       "JAX loop use asyncthrottle's JAX path in the script, at.throttle(batches, device=\"jax\") "
       "to bound its run-ahead and thr.defer(loss) to log the loss without a sync "
       "(docs/frameworks.md#jax)")


def jax_only(seen: dict[str, int]) -> bool:
    """Whether the script imported JAX and trained nothing run hears (no backward(), no
    optimizer step(), no torch.autograd.grad)."""
    return bool(seen.get("jax")) and not any(
        seen.get(key) for key in ("backwards", "optimizer_steps", "autograd_grad"))


def no_syncs(seen: dict[str, int]) -> str:
    """What an empty sync table says: no read of the script's, or (a JAX script) none heard."""
    if jax_only(seen):
        return ("not counted: run hears PyTorch's reads only, not JAX's (a float(loss) of a JAX "
                "array is a sync it does not see)")
    return "no host reads of device values by the script"


def _raised(raised: dict[str, Any], colon: str, when: str) -> str:
    """``{colon} SyntaxError at train.py:3{when}: '(' was never closed`` (Python's message is
    above it; only ``when`` where the runner found nothing to run)."""
    if not raised.get("type"):
        return when
    site = f" at {raised['site']}" if raised.get("site") else ""
    message = f": {raised['message']}" if raised.get("message") else ""
    return f"{colon} {raised['type']}{site}{when}{message}"


def _main_thread(seen: dict[str, int]) -> str:
    """What the main thread did, when nothing else explains that no step was found."""
    backwards, updates = seen.get("backwards", 0), seen.get("optimizer_steps", 0)
    if backwards or updates:
        return (f"backward() was called {_times(backwards, 'time')} and optimizers stepped "
                f"{_times(updates, 'time')}, yet no step was recorded")
    forwards = seen.get("forwards", 0)
    ran = f"ran {_times(forwards, 'training forward')} but " if forwards else ""
    return f"the script {ran}never called backward() or an optimizer's step()"


def _times(count: int, noun: str, plural: str = "s") -> str:
    return f"{count} {noun}{'' if count == 1 else plural}"


def typed(data: dict[str, Any]) -> str:
    """How run was started, as typed (the report's ``command``), for the report's own command
    lines: ``asyncthrottle`` or ``python -m asyncthrottle`` (also for a report older than its
    ``command``)."""
    return str(data.get("command") or "python -m asyncthrottle")


def _trace(data: dict[str, Any]) -> list[str]:
    trace = data.get("trace")
    if trace is not None and trace.get("written"):
        path = shlex.quote(trace["path"])
        return [f"  the trace is in {trace['path']}: {typed(data)} plot {path}"]
    if trace is not None:
        return ["  no trace written" + (" (no steps)" if not data["steps"] else "")]
    if not data["steps"]:
        return []
    return [f"  a trace: {typed(data)} run --trace trace.json "
            + shlex.join(data["argv"]) + f"; then {typed(data)} plot trace.json"]


def figure(value: float) -> str:
    """``value`` to 3 significant digits, never in an exponent (``0.0417``, ``12.3``, ``1230``)."""
    rounded = float(f"{value:.3g}")
    if rounded == 0 or not math.isfinite(rounded):
        return f"{rounded:g}"
    return f"{rounded:.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"


def duration(ms: float) -> str:
    """A section's time: ms below a second, else seconds (``12.3 ms``, ``50.3 s``)."""
    if abs(float(f"{ms:.3g}")) < 1000:
        return f"{figure(ms)} ms"
    return f"{figure(ms / 1000)} s"


def _verdict(data: dict[str, Any], stats: dict[str, Any]) -> list[str]:
    figures = (f"host waited {stats.get('wait_fraction', 0.0):.0%}, between steps (fetching) "
               f"{_share(stats, 'fetch_s')}, loop body {_share(stats, 'body_s')}")
    if stats.get("idle_fraction") is not None:
        figures += f", device idle {stats['idle_fraction']:.0%}"
    return [f"  verdict: {data['verdict']} ({figures}) -- {data['advice']}"]


def _share(stats: dict[str, Any], name: str) -> str:
    wall = stats.get("wall_s", 0.0)
    return f"{stats.get(name, 0.0) / wall:.0%}" if wall else "-"


def _losses(data: dict[str, Any]) -> list[str]:
    """One ``loss:`` line, or one an optimizer when there are several."""
    several = data.get("losses_by_optimizer")
    if not several:
        said = loss_summary(data["losses"], data["nonfinite"], data["last_nonfinite"])
        return [f"  loss: {said}"]
    ends = data["nonfinite_by_optimizer"]
    return [f"  loss: {name}: "
            f"{loss_summary(losses, ends[name]['nonfinite'], ends[name]['last_nonfinite'])}"
            for name, losses in several.items()]


def loss_summary(losses: Sequence[float | None], bad: Sequence[int], ended: str | None) -> str:
    """First, last (``ended``: the last delivered loss's NaN/Inf), min and the NaN/Inf steps."""
    known = [(step, v) for step, v in enumerate(losses) if v is not None]
    nan = f"NaN/Inf at steps {steps_named(bad)}" if bad else "no NaN/Inf"
    if not known:
        return (f"last {ended}, none finite" if ended else "none delivered") + f" ({nan})"
    low = min(known, key=lambda pair: pair[1])
    last = (f"{ended} (the last finite {known[-1][1]:.4g} at step {known[-1][0]})" if ended
            else f"{known[-1][1]:.4g}")
    return f"first {known[0][1]:.4g}, last {last}, min {low[1]:.4g} (step {low[0]}); {nan}"


def steps_named(steps: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 10 else "")


# the runner's own phases, in a step's order, before any other section (as the steps ran them)
_PHASES = ("forward", "backward", "optimizer")


def _sections(data: dict[str, Any]) -> list[str]:
    # (a section's median is kept from the step it was first timed in: a step begun back at a
    # teacher's forward has no forward section, so the first timed step may list it last)
    found = data["sections"]
    ordered = [name for name in _PHASES if name in found] + [
        name for name in found if name not in _PHASES]
    timed = ", ".join(f"{name} {duration(found[name])}" if found[name] is not None
                      else f"{name} -" for name in ordered)
    wait = f"input wait {data['input_wait_s']:.3f} s ({data['input_wait_fraction']:.0%})"
    return [f"  sections (median per step): {timed or 'none'}; {wait}"]


def _sync_lines(syncs: list[dict[str, Any]] | None,
                seen: dict[str, int] | None = None) -> list[str]:
    """The sync table: the top sites (in steps first, then by count a step), at most
    ``_SHOWN``; where a shown row's reads were timed, the time they blocked a step."""
    if syncs is None:
        return ["  sync sites: not counted (asyncthrottle.audit.syncsites is not available)"]
    if not syncs:
        return [f"  sync sites: {no_syncs(seen or {})}"]
    shown = sorted(syncs, key=lambda row: (not row["in_step"], -row["per_step"]))[:_SHOWN]
    named = [row["call"] + (f" (in {row['via']})" if row.get("via") else "") for row in shown]
    width = max(len(row["site"]) for row in shown)
    calls = max(len(call) for call in named)
    blocked = [blocked_of(row) for row in shown]
    head = "blocked"
    wide = max(len(head), *map(len, blocked)) if any(blocked) else 0
    lines = [f"  sync sites ({'site':<{width}}  {'call':<{calls}}  count  per step"
             + (f"  {head:>{wide}}" if wide else "") + "):"]
    for row, call, time in zip(shown, named, blocked, strict=True):
        where = ("" if row["in_step"] else "  outside steps") + ranks_of(row)
        lines.append(f"    {row['site']:<{width}}  {call:<{calls}}  {row['count']:>5}  "
                     f"{row['per_step']:>8.2f}" + (f"  {time or '-':>{wide}}" if wide else "")
                     + where)
    return lines + _more(len(syncs), "sites")


def synchronous_note(data: dict[str, Any]) -> str | None:
    """Why a fix of a read in the steps pays all the same, said once, where the device ran each
    op at once (None: it did not, or no read was in the steps)."""
    if data.get("synchronous") is not True or not any(
            row.get("in_step") for row in data.get("syncs") or []):
        return None
    return ("this device runs each op as it is issued (the CPU): a read here waits for nothing, "
            "so its time blocked does not show what it costs; on an accelerator each read in "
            "the steps waits for the device to finish the work queued before it (a sync), "
            "and a fix recovers that wait: measure it there")


def blocked_per_step(seconds: float | None) -> str:
    """A row's time blocked a step (``0.12 ms/step``; empty: not timed)."""
    return "" if seconds is None else f"{duration(seconds * 1000)}/step"


def blocked_of(row: dict[str, Any]) -> str:
    """A row's time blocked: a step's, for reads in the steps; for reads outside them (which
    blocked no step) the total (``0.12 ms in all``; empty: not timed)."""
    if row.get("in_step", True):
        return blocked_per_step(row.get("blocked_per_step_s"))
    seconds = row.get("blocked_s")
    return "" if seconds is None else f"{duration(seconds * 1000)} in all"


def _more(count: int, what: str) -> list[str]:
    return [f"    ... and {count - _SHOWN} more {what} (all in --json)"] if count > _SHOWN else []


def _guard(data: dict[str, Any]) -> list[str]:
    """``--max-syncs-per-step``'s outcome, last (what a CI log shows): a line for each site over
    the limit."""
    outcome, limit = data.get("guard"), data.get("max_syncs_per_step")
    if outcome is None or limit is None:
        return []
    head = f"  --max-syncs-per-step {limit:g}:"
    if outcome == PASSED:
        return [f"{head} passed: no sync site in the steps reads device values more than {limit:g} "
                "times a step"]
    code = data["exit_code"]
    ends = (f"exit code {GUARD_EXIT}" if code == 0
            else f"the script's own exit code {code} stands")
    if outcome == OVER_LIMIT:
        over = data["over_limit"]
        lines = [f"{head} FAILED: {_times(len(over), 'sync site')} over the limit ({ends})"]
        on = " on a rank" if "ranks" in data else ""
        return lines + [f"    {row['site']} reads {row['call']}"
                        + (f" (in {row['via']})" if row.get("via") else "")
                        + f" {row['per_step']:.2f} times a step in steps{on}, over the limit of "
                          f"{limit:g}" for row in over]
    why = ("no training step found, so its syncs per step cannot be judged" if outcome == NO_STEPS
           else "the reads were not counted, so they cannot be judged")
    return [f"{head} FAILED: {why} ({ends})"]


def _suggestions(data: dict[str, Any]) -> list[str]:
    """The suggestions, with the diff of each certain rewrite (the report's ``patches``) under its
    own: its hunks not shown above (the import, the loop's wrap), at most ``_DIFF_SHOWN`` lines;
    then where the patch of them all is, or how to get it."""
    said = suggested(data)
    if not said:
        return []
    lines, shown = ["  suggestions:"], set[str]()
    for k, (line, diff) in enumerate(said[:_SHOWN], 1):
        lines.append(f"    {k}. {line}")
        if diff is not None:
            lines += _diff(new_rows(diff, shown), _suggest_path(data))
    lines += _more(len(said), "suggestions")
    patch = patch_said(data)
    return lines + ([f"  {''.join(patch)}"] if patch else [])


def suggested(data: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Each suggestion with the diff of its certain rewrite (None: none)."""
    diffs = [entry for entry in data.get("patches") or [] if entry.get("diff")]
    out: list[tuple[str, str | None]] = []
    for line in data.get("suggestions") or []:
        entry = next((e for e in diffs if line.startswith(f"{e['site']} ")), None)
        if entry is not None:
            diffs.remove(entry)
        out.append((line, entry["diff"] if entry is not None else None))
    return out


def _diff(rows: list[str], path: str | None) -> list[str]:
    """``rows`` (:func:`new_rows`) indented, at most ``_DIFF_SHOWN``."""
    lines = [f"       {row}".rstrip() for row in rows[:_DIFF_SHOWN]]
    if len(rows) > _DIFF_SHOWN:
        whole = f"the whole patch is in {path}" if path else "--suggest PATH writes the whole patch"
        lines.append(f"       ... {_times(len(rows) - _DIFF_SHOWN, 'more line')}: {whole}")
    return lines


def new_rows(diff: str, shown: set[str]) -> list[str]:
    """``diff``'s lines less its file header and hunks already in ``shown`` (which gains the
    rest), and a last line that says how many hunks were shown above."""
    header, *hunks = _hunks(diff)
    rows = [] if "\n".join(header) in shown else header
    shown.add("\n".join(header))
    again = 0
    for hunk in hunks:
        body = "\n".join(hunk[1:])
        again += body in shown
        if body not in shown:
            shown.add(body)
            rows += hunk
    if again:
        rows.append(f"(and {_times(again, 'change')} shown above)")
    return rows


def _hunks(diff: str) -> list[list[str]]:
    """A one-file unified diff's file header (``---``, ``+++``), then each hunk, as lines."""
    parts: list[list[str]] = [[]]
    for row in diff.splitlines():
        if row.startswith("@@"):
            parts.append([])
        parts[-1].append(row)
    return parts


def patch_said(data: dict[str, Any]) -> tuple[str, str, str] | None:
    """Where ``--suggest`` wrote the patch and how to apply it; without ``--suggest``, the
    command that writes it (where a rewrite is certain): what is said before the command, the
    command (``""``: none) and what is said after it; None: nothing to say."""
    certain = sum(1 for entry in data.get("patches") or [] if entry.get("diff"))
    path = _suggest_path(data)
    if path is None:
        return (f"the {_times(certain, 'certain rewrite')} as one patch: ",
                f"{typed(data)} run --suggest fix.patch {shlex.join(data['argv'])}",
                "") if certain else None
    if not certain:
        return (f"--suggest {path}: no rewrite is certain, the file is empty (the suggestions "
                "say what to change)", "", "")
    folder = os.path.dirname(data["script"])
    where = f" -d {shlex.quote(folder)}" if folder else ""
    them = "it" if certain == 1 else "them"
    return (f"--suggest {path}: {_times(certain, 'certain rewrite')}; apply {them}: ",
            f"patch -p1{where} < {shlex.quote(path)}",
            f" (or git apply in {folder or 'this folder'})")


def _suggest_path(data: dict[str, Any]) -> str | None:
    """``--suggest``'s path as typed (None: not given)."""
    typed = list(data.get("options") or [])
    for k, option in enumerate(typed):
        if option == "--suggest" and k + 1 < len(typed):
            return str(typed[k + 1])
        if option.startswith("--suggest="):
            return str(option.partition("=")[2])
    return None
