"""The runner's report: the JSON of ``--json`` (schema 1) and the text printed on stderr."""

from __future__ import annotations

import ast
import functools
import linecache
import math
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any

from .steps import Source, Steps

__all__ = ["SCHEMA", "collect", "text"]

SCHEMA = 1
# a read in at least this share of the steps is suggested away
_OFTEN = 0.5
# the loop's share of time in its loader's next() from which the loader is suggested
_INPUT = 0.3
# the text shows at most this many sync sites and suggestions (the JSON keeps them all)
_SHOWN = 20
# the verdict's advice before 2 steps ("no steps yet") replaced once there is a step
_ONE_STEP = "one step is too few to tell what limits the loop (a verdict needs 2 steps or more)"

# what each kind of host read is, and what to do instead
_READS = {
    "value": "thr.defer({name}) instead, or read it every 50 steps",
    "branch": "a branch on a device value syncs: compute it on the device (torch.where), or "
              "check it every 50 steps",
    "shape": "a data-dependent shape syncs: keep shapes fixed (torch.where, a multiply by the "
             "mask)",
    "copy": "a copy to the host syncs: thr.defer({name}) copies it without a sync",
    "print": "printing a tensor reads it: print what thr.defer({name}) delivers",
}
_KINDS = {"__bool__": "branch", "nonzero": "shape", "masked_select": "shape", "unique": "shape",
          "__getitem__": "shape", "cpu": "copy", "numpy": "copy", "to": "copy",
          "__repr__": "print", "__str__": "print", "__format__": "print", "print": "print"}
# a read via an installed package, by the file that made it (the ``via`` line's, "/"-separated):
# whose read it is; the first match wins
_OWNERS = (
    (r"(^|/)transformers/(trainer\w*|training_args\w*|integrations/integration_utils)\.py$",
     "the HF Trainer"),
    (r"(^|/)transformers/(models/|generation/|loss/|masking_utils\.py|modeling_\w+\.py|"
     r"cache_utils\.py|pytorch_utils\.py|integrations/\w*attention\w*\.py)", "the model"),
    (r"(^|/)(lightning/pytorch|pytorch_lightning)/(trainer|loops|loggers|callbacks/progress)/|"
     r"(^|/)(lightning/pytorch|pytorch_lightning)/core/module\.py$|"
     r"(^|/)(lightning/fabric|lightning_fabric)/(utilities/apply_func\.py$|loggers/)", "Lightning"),
    (r"(^|/)(lightning|pytorch_lightning|lightning_fabric)/", "Lightning's code"),
)
# what to set instead, by the owner and the kind of read (None: any other)
_SETTINGS = {
    ("the HF Trainer", "branch"): "set TrainingArguments(logging_nan_inf_filter=False) (its "
                                  "NaN/Inf check of each micro-batch's loss)",
    ("the HF Trainer", None): "raise TrainingArguments(logging_steps=) (it reads the loss and the "
                              "grad norm it logs)",
    ("Lightning", None): "log with self.log(..., on_step=False) (a prog_bar=True value is read "
                         "every step), or raise Trainer(log_every_n_steps=) (a logger's values "
                         "are read then)",
}
# what is true of a read that is not the framework's logging
_NOT_LOGGING = {
    "the model": "the model's own read in {via} (its forward's code, not the HF Trainer's nor "
                 "the script's), so no TrainingArguments setting and no thr.defer moves it: it "
                 "reads what the model was given (a mask, a length); see that line for the input "
                 "or config that skips it",
    "Lightning's code": "Lightning's own read in {via}, not its logging (log_every_n_steps does "
                        "not move it) nor the script's, so thr.defer cannot move it: see that "
                        "line for the callback or Trainer setting that makes it",
}
_SPELLING = {"__float__": "float({name})", "__int__": "int({name})", "__bool__": "`if {name}:`",
             "__index__": "int({name})", "__format__": "f'{{{name}}}'", "__repr__": "repr({name})",
             "__str__": "str({name})", "__getitem__": "{name}[mask]"}
# the calls that make a read of their first argument, by the read (``float(x)``: ``__float__``)
_BUILTINS = {"__float__": ("float",), "__int__": ("int",), "__index__": ("int", "range"),
             "__bool__": ("bool",), "__str__": ("str", "print"), "__repr__": ("repr",),
             "__format__": ("format",), "print": ("print",),
             "__array__": ("asarray", "array", "np.asarray", "np.array", "numpy.asarray",
                           "numpy.array")}


def collect(steps: Steps, rows: Sequence[dict[str, Any]] | None, *, script: str, code: int,
            argv: Sequence[str]) -> dict[str, Any]:
    """The report's data (``--json``'s schema 1) from what the run found. Reads the delivered
    host copies: call it once the sync audit has stopped. ``trace`` is None: the caller sets it
    (``{"path": ..., "written": ...}``) once it has written a trace."""
    source = _main(steps.sources)
    stats = source.hooks.throttle.stats if source is not None else None
    count = stats.steps if stats is not None else 0
    wall = stats.wall_s if stats is not None else 0.0
    verdict = stats.verdict if stats is not None else "unknown"
    advice = stats.advice if stats is not None else ""
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "script": script,
        "argv": list(argv),
        "exit_code": code,
        "steps": count,
        "steps_per_s": stats.steps_per_s if stats is not None else 0.0,
        **_series(source.series() if source is not None else [], count),
        "syncs": _syncs(rows, steps.tail_reads, count) if rows is not None else None,
        "verdict": verdict,
        "advice": _ONE_STEP if count and verdict == "unknown" else advice,
        "sections": dict(stats.sections or {}) if stats is not None else {},
        "input_wait_s": steps.input_wait,
        "input_wait_fraction": steps.input_wait / wall if wall > 0 else 0.0,
        "loader": steps.loader,
        "framework": source.framework if source is not None else None,
        "error": repr(steps.error) if steps.error is not None else None,
        "stats": _plain(stats.as_dict()) if stats is not None else {},
        "seen": dict(steps.seen),
        "trace": None,
    }
    several = source.by_optimizer() if source is not None else {}
    if several:
        each = {name: _series(values, count) for name, values in several.items()}
        data["losses_by_optimizer"] = {name: found.pop("losses") for name, found in each.items()}
        data["nonfinite_by_optimizer"] = each
    data["suggestions"] = suggestions(data, synchronous=source is None
                                      or source.hooks.throttle.synchronous)
    return _plain(data)  # type: ignore[no-any-return]


def _main(sources: Sequence[Source]) -> Source | None:
    """The throttle that saw the most steps (the runner's, or a framework's callback)."""
    if not sources:
        return None
    return max(sources, key=lambda source: source.hooks.throttle.stats.steps)


def _series(series: Sequence[float | None], count: int) -> dict[str, Any]:
    """One loss series by step (``count`` steps): ``losses`` (None: none delivered, or NaN/Inf),
    ``nonfinite`` (the NaN/Inf steps) and ``last_nonfinite`` (the last delivered loss as
    ``"nan"``, ``"inf"`` or ``"-inf"`` when it is not finite, else None)."""
    values = [_float(v) for v in list(series[:count]) + [None] * (count - len(series))]
    delivered = [v for v in values if v is not None]
    last = delivered[-1] if delivered else None
    return {"losses": [v if v is not None and math.isfinite(v) else None for v in values],
            "nonfinite": [step for step, v in enumerate(values)
                          if v is not None and not math.isfinite(v)],
            "last_nonfinite": None if last is None or math.isfinite(last) else str(last)}


def _float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _syncs(rows: Sequence[dict[str, Any]], tail: Sequence[dict[str, Any]],
           steps: int) -> list[dict[str, Any]]:
    """The audit's rows, sorted by count per step, with the sites read only after the last step's
    update (no step followed: after the script's loop) moved out of the steps. ``file``: the
    site's file (absolute; None where the audit did not give it)."""
    counts: dict[tuple[str, str, str | None, bool], int] = {}
    files: dict[str, str | None] = {}
    for row in rows:
        key = (row["site"], row["call"], row.get("via"), bool(row["in_step"]))
        counts[key] = counts.get(key, 0) + row["count"]
        files[row["site"]] = files.get(row["site"]) or row.get("file")
    for row in tail:
        inside = (row["site"], row["call"], row.get("via"), True)
        outside = (*inside[:3], False)
        # a site read in earlier steps too is the loop's own line: it stays in the steps
        if counts.get(inside, 0) == row["count"]:
            counts[inside] = 0
            counts[outside] = counts.get(outside, 0) + row["count"]
    out = [{"site": site, "call": call, "count": count,
            "per_step": count / steps if steps else 0.0, "in_step": inside, "via": via,
            "file": files.get(site)}
           for (site, call, via, inside), count in counts.items() if count > 0]
    return sorted(out, key=lambda row: (-row["per_step"], row["site"], row["via"] or ""))


def suggestions(data: dict[str, Any], *, synchronous: bool) -> list[str]:
    """What to change, most costly first: the reads made in most steps (a framework's own read
    between its steps too, once a step or more), then the loader."""
    said = []
    for row in data["syncs"] or []:
        via = row.get("via")
        if row["per_step"] >= _OFTEN and (row["in_step"] or (via and row["per_step"] >= 1)):
            said.append(_read(row) if via is None else _framework_read(row))
    loader = data["loader"]
    if loader is not None and (data["verdict"] == "input-bound"
                               or data["input_wait_fraction"] >= _INPUT):
        said.append(_loader(loader, synchronous))
    if data["verdict"] not in ("synchronous", "unknown", "device-bound", "balanced"):
        said.append(f"the verdict, {data['verdict']}: {data['advice']}")
    return said


def _read(row: dict[str, Any]) -> str:
    call = row["call"].rsplit(".", 1)[-1]
    names = _receivers(row, call)
    if row["call"].startswith("torch."):
        spelling = f"{row['call']}({{name}})"
    else:
        spelling = _SPELLING.get(call, "{name}." + call + "()")
    spelled = " and ".join(spelling.format(name=_atom(name) if spelling.startswith("{name}")
                                           else name) for name in names)
    both = names[0] if len(names) == 1 else f"({', '.join(names)})"
    advice = _READS[_KINDS.get(call, "value")].format(name=both)
    verb = "branches on" if call == "__bool__" else "calls"
    return f"{row['site']} {verb} {spelled} {_often(row)}: {advice}"


def _framework_read(row: dict[str, Any]) -> str:
    """A read the script's line makes through an installed package: a framework's, whose setting
    (not ``thr.defer``) moves it; a model's; another package's, which may be reading what the
    line gave it. Whose it is, is told by the file that made it (``via``), not its package."""
    file = row["via"].rpartition(":")[0].replace("\\", "/")
    package = file.split("/", 1)[0].removesuffix(".py")
    said = (f"{row['site']} calls {package}, whose {row['via']} reads a device value "
            f"({row['call']}) {_often(row)}")
    owner = next((who for pattern, who in _OWNERS if re.search(pattern, file)), None)
    if owner is None:
        return (f"{said}: {package}'s read, not the line's own: hand {package} a host value (one "
                f"thr.defer delivered) instead of a tensor, or look for the {package} setting "
                "that makes it, or call it less often")
    if owner in _NOT_LOGGING:
        return f"{said}: {_NOT_LOGGING[owner].format(via=row['via'])}"
    kind = _KINDS.get(row["call"].rsplit(".", 1)[-1])
    advice = _SETTINGS.get((owner, kind)) or _SETTINGS[(owner, None)]
    return f"{said}: {owner}'s own read, not the script's, so thr.defer cannot move it: {advice}"


def _atom(name: str) -> str:
    """``name`` as the receiver of a method (``(mask > 0)``, ``loss``)."""
    try:
        node = ast.parse(name, mode="eval").body
    except SyntaxError:
        return name
    atoms = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
    return name if isinstance(node, atoms) else f"({name})"


def _often(row: dict[str, Any]) -> str:
    if row["per_step"] > 1.0:
        return f"{row['per_step']:.3g} times a step"
    return "every step" if row["per_step"] >= 1 else f"in {row['per_step']:.0%} of the steps"


# -- the receivers: what a site's line reads ---------------------------------------------------


def _receivers(row: dict[str, Any], call: str) -> list[str]:
    """The expressions the site's line reads with ``call``, as written (``output.mean()`` in
    ``output.mean().item()``; each of ``a.item() + b.item()``), from the site's file; a regex
    on the line where the file does not parse; else ``["the value"]``."""
    path, _, number = row["site"].rpartition(":")
    file = row.get("file") or path
    line = int(number) if number.isdigit() else 0
    # the file as it is now, not as the script's traceback (or an earlier report) read it
    linecache.checkcache(file)
    found = _parsed(file, line, call)
    if not found:
        fallback = _matched(linecache.getline(file, line), call)
        found = [fallback] if fallback else []
    return found or ["the value"]


def _parsed(file: str, line: int, call: str) -> list[str]:
    """The receivers ``ast`` finds on ``line`` of ``file`` (the reads that start on it, else the
    innermost that span it), left to right."""
    tree = _tree("".join(linecache.getlines(file)))
    if tree is None:
        return []
    hits = [(read, target) for node in ast.walk(tree) if _spans(node, line)
            for read, target in _targets(node, call) if _spans(read, line)]
    starting = [hit for hit in hits if hit[0].lineno == line]
    if not starting and hits:
        span = min(_span(read) for read, _ in hits)
        starting = [hit for hit in hits if _span(hit[0]) == span]
    starting.sort(key=lambda hit: (hit[0].lineno, hit[0].col_offset))
    names: list[str] = []
    for _, target in starting:
        name = ast.unparse(target)
        if name not in names:
            names.append(name)
    return names


@functools.lru_cache(maxsize=4)
def _tree(source: str) -> ast.Module | None:
    """``source`` parsed (once for all the suggestions of a file), or None."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _spans(node: ast.AST, line: int) -> bool:
    start = getattr(node, "lineno", None)
    return start is not None and start <= line <= (getattr(node, "end_lineno", None) or start)


def _span(node: ast.expr | ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno


def _targets(node: ast.AST, call: str) -> Iterator[tuple[ast.expr | ast.stmt, ast.expr]]:
    """The reads ``node`` makes with ``call``: each read's own node and what it reads."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == call:
            # torch.nonzero(x): the function form reads its argument, not torch
            module = isinstance(func.value, ast.Name) and func.value.id in ("torch", "Tensor")
            if module and node.args:
                yield node, node.args[0]
            elif not module:
                yield node, func.value
        elif node.args and ast.unparse(func) in _BUILTINS.get(call, ()):
            yield node, node.args[0]
    elif call == "__format__" and isinstance(node, ast.FormattedValue):
        yield node, node.value
    elif call == "__bool__" and isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        yield node.test, node.test
    elif call == "__getitem__" and isinstance(node, ast.Subscript) and not isinstance(
            node.slice, (ast.Constant, ast.Slice, ast.Tuple)):
        yield node, node.value


def _matched(source: str, call: str) -> str | None:
    """The receiver a regex finds on the line's ``source`` (the line of a file that does not
    parse)."""
    found = re.search(r"([A-Za-z_][\w.]*)\." + re.escape(call) + r"\(", source)
    if found is None and call == "__bool__":
        found = re.search(r"\b(?:if|while|elif)\s+(.+?)\s*:", source)
    if found is None and call.startswith("__"):
        found = re.search(r"(?:float|int|bool|print|str|repr)\(\s*([A-Za-z_][\w.]*)", source)
    return found.group(1) if found else None


def _loader(loader: dict[str, Any], synchronous: bool) -> str:
    workers, pinned = loader.get("num_workers", 0), loader.get("pin_memory", False)
    now = f"DataLoader(num_workers={workers}" + ("" if synchronous else f", pin_memory={pinned}")
    tries = [f"num_workers={max(4, 2 * workers)}"]
    if not synchronous and not pinned:
        tries.append("pin_memory=True")
    return f"{now}): try {', '.join(tries)} (the loop waits for its batches)"


def _plain(value: Any) -> Any:
    """``value`` for JSON: NaN and Inf as None, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- the text ----------------------------------------------------------------------------------


def text(data: dict[str, Any], *, rank: tuple[int, int] | None = None,
         slowest: Any = None) -> str:
    """The report as printed on stderr."""
    who = f" (rank {rank[0]} of {rank[1]})" if rank is not None else ""
    stats = data["stats"]
    lines = [f"asyncthrottle run{who}: {data['script']}: {data['steps']} steps in "
             f"{stats.get('wall_s', 0.0):.2f} s ({_figure(data['steps_per_s'])} steps/s), exit "
             f"code {data['exit_code']}"]
    if data["steps"] == 0:
        lines.append(_nothing(data.get("seen") or {}, data["argv"]))
    if data["error"] is not None:
        lines.append(f"  the runner stopped finding steps after its own error: {data['error']}")
    if data["steps"]:
        lines += _verdict(data, stats) + _losses(data) + _sections(data)
    if slowest is not None:
        lines.append(f"  slowest rank: {slowest}")
    lines += _sync_lines(data["syncs"])
    if data["suggestions"]:
        lines.append("  suggestions:")
        lines += [f"    {k}. {said}" for k, said in enumerate(data["suggestions"][:_SHOWN], 1)]
        lines += _more(len(data["suggestions"]), "suggestions")
    lines += _trace(data)
    return "\n".join(lines)


def _nothing(seen: dict[str, int], argv: Sequence[str]) -> str:
    """Why no step was found, from what the hooks saw."""
    why = []
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
    where = " on the main thread" if seen.get("other_threads") else ""
    return f"  no training step found{where}: {'; '.join(why or [_main_thread(seen)])} (0 steps)"


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


def _trace(data: dict[str, Any]) -> list[str]:
    trace = data.get("trace")
    if trace is not None and trace.get("written"):
        path = shlex.quote(trace["path"])
        return [f"  the trace is in {trace['path']}: python -m asyncthrottle plot {path}"]
    if trace is not None:
        return ["  no trace written" + (" (no steps)" if not data["steps"] else "")]
    if not data["steps"]:
        return []
    return ["  a trace: python -m asyncthrottle run --trace trace.json "
            + shlex.join(data["argv"]) + "; then python -m asyncthrottle plot trace.json"]


def _figure(value: float) -> str:
    """``value`` to 3 significant digits, never in an exponent (``0.0417``, ``12.3``, ``1230``)."""
    rounded = float(f"{value:.3g}")
    if rounded == 0 or not math.isfinite(rounded):
        return f"{rounded:g}"
    return f"{rounded:.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"


def _duration(ms: float) -> str:
    """A section's time: ms below a second, else seconds (``12.3 ms``, ``50.3 s``)."""
    if abs(float(f"{ms:.3g}")) < 1000:
        return f"{_figure(ms)} ms"
    return f"{_figure(ms / 1000)} s"


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
        return [f"  loss: {_loss(data['losses'], data['nonfinite'], data['last_nonfinite'])}"]
    ends = data["nonfinite_by_optimizer"]
    return [f"  loss: {name}: "
            f"{_loss(losses, ends[name]['nonfinite'], ends[name]['last_nonfinite'])}"
            for name, losses in several.items()]


def _loss(losses: Sequence[float | None], bad: Sequence[int], ended: str | None) -> str:
    """First, last (``ended``: the last delivered loss's NaN/Inf), min and the NaN/Inf steps."""
    known = [(step, v) for step, v in enumerate(losses) if v is not None]
    nan = f"NaN/Inf at steps {_steps(bad)}" if bad else "no NaN/Inf"
    if not known:
        return (f"last {ended}, none finite" if ended else "none delivered") + f" ({nan})"
    low = min(known, key=lambda pair: pair[1])
    last = (f"{ended} (the last finite {known[-1][1]:.4g} at step {known[-1][0]})" if ended
            else f"{known[-1][1]:.4g}")
    return f"first {known[0][1]:.4g}, last {last}, min {low[1]:.4g} (step {low[0]}); {nan}"


def _steps(steps: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 10 else "")


def _sections(data: dict[str, Any]) -> list[str]:
    timed = ", ".join(f"{name} {_duration(ms)}" if ms is not None else f"{name} -"
                      for name, ms in data["sections"].items())
    wait = f"input wait {data['input_wait_s']:.3f} s ({data['input_wait_fraction']:.0%})"
    return [f"  sections (median per step): {timed or 'none'}; {wait}"]


def _sync_lines(syncs: list[dict[str, Any]] | None) -> list[str]:
    """The sync table: the top sites (in steps first, then by count a step), at most
    ``_SHOWN``."""
    if syncs is None:
        return ["  sync sites: not counted (asyncthrottle.run.syncsites is not available)"]
    if not syncs:
        return ["  sync sites: no host reads of device values by the script"]
    shown = sorted(syncs, key=lambda row: (not row["in_step"], -row["per_step"]))[:_SHOWN]
    named = [row["call"] + (f" (in {row['via']})" if row.get("via") else "") for row in shown]
    width = max(len(row["site"]) for row in shown)
    calls = max(len(call) for call in named)
    lines = [f"  sync sites ({'site':<{width}}  {'call':<{calls}}  count  per step):"]
    for row, call in zip(shown, named, strict=True):
        where = "" if row["in_step"] else "  outside steps"
        lines.append(f"    {row['site']:<{width}}  {call:<{calls}}  {row['count']:>5}  "
                     f"{row['per_step']:>8.2f}{where}")
    return lines + _more(len(syncs), "sites")


def _more(count: int, what: str) -> list[str]:
    return [f"    ... and {count - _SHOWN} more {what} (all in --json)"] if count > _SHOWN else []
