"""The runner's report: the JSON of ``--json`` (schema 1) and the text printed on stderr."""

from __future__ import annotations

import linecache
import math
import re
import shlex
from collections.abc import Sequence
from typing import Any

from .steps import Source, Steps

__all__ = ["SCHEMA", "collect", "text"]

SCHEMA = 1
# a read in at least this share of the steps is suggested away
_OFTEN = 0.5
# the loop's share of time in its loader's next() from which the loader is suggested
_INPUT = 0.3

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
# a read via a package (a row with "via"): the framework whose own read it is, by its package
_OWNERS = {"transformers": "the HF Trainer", "lightning": "Lightning",
           "pytorch_lightning": "Lightning", "lightning_fabric": "Lightning"}
# what to set instead, by the framework and the kind of read (None: any other)
_SETTINGS = {
    ("the HF Trainer", "branch"): "set TrainingArguments(logging_nan_inf_filter=False) (its "
                                  "NaN/Inf check of each micro-batch's loss)",
    ("the HF Trainer", None): "raise TrainingArguments(logging_steps=) (it reads the loss and the "
                              "grad norm it logs)",
    ("Lightning", None): "log with self.log(..., on_step=False) (a prog_bar=True value is read "
                         "every step), or raise Trainer(log_every_n_steps=) (a logger's values "
                         "are read then)",
}
_SPELLING = {"__float__": "float({name})", "__int__": "int({name})", "__bool__": "`if {name}:`",
             "__index__": "int({name})", "__format__": "f'{{{name}}}'", "__repr__": "repr({name})",
             "__str__": "str({name})", "__getitem__": "{name}[mask]"}


def collect(steps: Steps, rows: Sequence[dict[str, Any]] | None, *, script: str, code: int,
            argv: Sequence[str]) -> dict[str, Any]:
    """The report's data (``--json``'s schema 1) from what the run found. Reads the delivered
    host copies: call it once the sync audit has stopped."""
    source = _main(steps.sources)
    stats = source.hooks.throttle.stats if source is not None else None
    count = stats.steps if stats is not None else 0
    delivered = source.losses if source is not None else {}
    values = [_float(delivered.get(step)) for step in range(count)]
    wall = stats.wall_s if stats is not None else 0.0
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "script": script,
        "argv": list(argv),
        "exit_code": code,
        "steps": count,
        "steps_per_s": stats.steps_per_s if stats is not None else 0.0,
        "losses": [v if v is not None and math.isfinite(v) else None for v in values],
        "nonfinite": [step for step, v in enumerate(values)
                      if v is not None and not math.isfinite(v)],
        "syncs": _syncs(rows, steps.tail_reads, count) if rows is not None else None,
        "verdict": stats.verdict if stats is not None else "unknown",
        "advice": stats.advice if stats is not None else "",
        "sections": dict(stats.sections or {}) if stats is not None else {},
        "input_wait_s": steps.input_wait,
        "input_wait_fraction": steps.input_wait / wall if wall > 0 else 0.0,
        "loader": steps.loader,
        "framework": source.framework if source is not None else None,
        "error": repr(steps.error) if steps.error is not None else None,
        "stats": _plain(stats.as_dict()) if stats is not None else {},
    }
    data["suggestions"] = suggestions(data, synchronous=source is None
                                      or source.hooks.throttle.synchronous)
    return _plain(data)  # type: ignore[no-any-return]


def _main(sources: Sequence[Source]) -> Source | None:
    """The throttle that saw the most steps (the runner's, or a framework's callback)."""
    if not sources:
        return None
    return max(sources, key=lambda source: source.hooks.throttle.stats.steps)


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
    update (no step followed: after the script's loop) moved out of the steps."""
    counts: dict[tuple[str, str, str | None, bool], int] = {}
    for row in rows:
        key = (row["site"], row["call"], row.get("via"), bool(row["in_step"]))
        counts[key] = counts.get(key, 0) + row["count"]
    for row in tail:
        inside = (row["site"], row["call"], row.get("via"), True)
        outside = (*inside[:3], False)
        # a site read in earlier steps too is the loop's own line: it stays in the steps
        if counts.get(inside, 0) == row["count"]:
            counts[inside] = 0
            counts[outside] = counts.get(outside, 0) + row["count"]
    out = [{"site": site, "call": call, "count": count,
            "per_step": count / steps if steps else 0.0, "in_step": inside, "via": via}
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
    name = _receiver(row["site"], call)
    spelled = _SPELLING.get(call, "{name}." + call + "()").format(name=name)
    advice = _READS[_KINDS.get(call, "value")].format(name=name)
    verb = "branches on" if call == "__bool__" else "calls"
    return f"{row['site']} {verb} {spelled} {_often(row)}: {advice}"


def _framework_read(row: dict[str, Any]) -> str:
    """A read the script's line makes through an installed package: a framework's, whose setting
    (not ``thr.defer``) moves it; another package's, which may be reading what the line gave it."""
    package = re.split(r"[/\\]", row["via"].rpartition(":")[0], maxsplit=1)[0].removesuffix(".py")
    said = (f"{row['site']} calls {package}, whose {row['via']} reads a device value "
            f"({row['call']}) {_often(row)}")
    owner = _OWNERS.get(package)
    if owner is None:
        return (f"{said}: {package}'s read, not the line's own: hand {package} a host value (one "
                f"thr.defer delivered) instead of a tensor, or look for the {package} setting "
                "that makes it, or call it less often")
    kind = _KINDS.get(row["call"].rsplit(".", 1)[-1])
    advice = _SETTINGS.get((owner, kind)) or _SETTINGS[(owner, None)]
    return f"{said}: {owner}'s own read, not the script's, so thr.defer cannot move it: {advice}"


def _often(row: dict[str, Any]) -> str:
    if row["per_step"] > 1.0:
        return f"{row['per_step']:.3g} times a step"
    return "every step" if row["per_step"] >= 1 else f"in {row['per_step']:.0%} of the steps"


def _receiver(site: str, call: str) -> str:
    """The name the site's line reads (``loss`` in ``loss.item()``), from the script's source."""
    path, _, line = site.rpartition(":")
    source = linecache.getline(path, int(line)) if line.isdigit() else ""
    found = re.search(r"([A-Za-z_][\w.]*)\." + re.escape(call) + r"\(", source)
    if found is None and call == "__bool__":
        found = re.search(r"\b(?:if|while|elif)\s+(.+?)\s*:", source)
    if found is None and call.startswith("__"):
        found = re.search(r"(?:float|int|bool|print|str|repr)\(\s*([A-Za-z_][\w.]*)", source)
    return found.group(1) if found else "the value"


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


def text(data: dict[str, Any], *, rank: tuple[int, int] | None = None,
         slowest: Any = None) -> str:
    """The report as printed on stderr."""
    who = f" (rank {rank[0]} of {rank[1]})" if rank is not None else ""
    stats = data["stats"]
    lines = [f"asyncthrottle run{who}: {data['script']}: {data['steps']} steps in "
             f"{stats.get('wall_s', 0.0):.2f} s ({data['steps_per_s']:.1f} steps/s), exit code "
             f"{data['exit_code']}"]
    if data["steps"] == 0:
        lines.append("  no training step found: the script never called backward() or an "
                     "optimizer's step() (0 steps)")
    if data["error"] is not None:
        lines.append(f"  the runner stopped finding steps after its own error: {data['error']}")
    if data["steps"]:
        lines += _verdict(data, stats) + _loss(data) + _sections(data)
    if slowest is not None:
        lines.append(f"  slowest rank: {slowest}")
    lines += _sync_lines(data["syncs"])
    if data["suggestions"]:
        lines.append("  suggestions:")
        lines += [f"    {k}. {said}" for k, said in enumerate(data["suggestions"], 1)]
    lines.append("  a trace: python -m asyncthrottle run --trace trace.json "
                 + shlex.join(data["argv"]) + "; then python -m asyncthrottle plot trace.json")
    return "\n".join(lines)


def _verdict(data: dict[str, Any], stats: dict[str, Any]) -> list[str]:
    figures = (f"host waited {stats.get('wait_fraction', 0.0):.0%}, between steps (fetching) "
               f"{_share(stats, 'fetch_s')}, loop body {_share(stats, 'body_s')}")
    if stats.get("idle_fraction") is not None:
        figures += f", device idle {stats['idle_fraction']:.0%}"
    return [f"  verdict: {data['verdict']} ({figures}) -- {data['advice']}"]


def _share(stats: dict[str, Any], name: str) -> str:
    wall = stats.get("wall_s", 0.0)
    return f"{stats.get(name, 0.0) / wall:.0%}" if wall else "-"


def _loss(data: dict[str, Any]) -> list[str]:
    known = [(step, v) for step, v in enumerate(data["losses"]) if v is not None]
    bad = data["nonfinite"]
    nan = f"NaN/Inf at steps {_steps(bad)}" if bad else "no NaN/Inf"
    if not known:
        return [f"  loss: none delivered ({nan})"]
    low = min(known, key=lambda pair: pair[1])
    return [f"  loss: first {known[0][1]:.4g}, last {known[-1][1]:.4g}, min {low[1]:.4g} (step "
            f"{low[0]}); {nan}"]


def _steps(steps: Sequence[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:10])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 10 else "")


def _sections(data: dict[str, Any]) -> list[str]:
    timed = ", ".join(f"{name} {ms:.3g} ms" if ms is not None else f"{name} -"
                      for name, ms in data["sections"].items())
    wait = f"input wait {data['input_wait_s']:.3f} s ({data['input_wait_fraction']:.0%})"
    return [f"  sections (median per step): {timed or 'none'}; {wait}"]


def _sync_lines(syncs: list[dict[str, Any]] | None) -> list[str]:
    if syncs is None:
        return ["  sync sites: not counted (asyncthrottle.run.syncsites is not available)"]
    if not syncs:
        return ["  sync sites: no host reads of device values by the script"]
    named = [row["call"] + (f" (in {row['via']})" if row.get("via") else "") for row in syncs]
    width = max(len(row["site"]) for row in syncs)
    calls = max(len(call) for call in named)
    lines = [f"  sync sites ({'site':<{width}}  {'call':<{calls}}  count  per step):"]
    for row, call in zip(syncs, named, strict=True):
        where = "" if row["in_step"] else "  outside steps"
        lines.append(f"    {row['site']:<{width}}  {call:<{calls}}  {row['count']:>5}  "
                     f"{row['per_step']:>8.2f}{where}")
    return lines
