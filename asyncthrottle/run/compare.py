"""``python -m asyncthrottle compare BEFORE.json AFTER.json``: what changed between two runs'
reports (``run --json``): the speed, the sync sites, the verdict and whether the losses agree.
``--fail-on-new-syncs`` and ``--fail-if-slower PCT`` make it a check a CI job can run after an
edit of the script.

Sync sites are matched by what they are, not by their line (:mod:`.sitematch`): an edit above a
read moves its line and leaves it the same read. A comparison of runs that are not alike (a script
that failed, no step found, fewer steps after) is said first, and fails every rule asked for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._typed import command, examples
from .noise import noise
from .reportfile import ReportError, load
from .sitematch import match
from .text import figure, steps_named

__all__ = ["COMPARE", "FAILED", "UNUSABLE", "ReportError", "compare", "load", "main", "more_often",
           "text"]

# the format of the comparison --json OUT writes
COMPARE = 1
# the exit codes: a --fail-* rule failed; a report that cannot be compared, or a usage error
FAILED, UNUSABLE = 1, 2


def compare(before: dict[str, Any], after: dict[str, Any], *, fail_on_new_syncs: bool = False,
            fail_if_slower: float | None = None, paths: tuple[str, str] = ("BEFORE", "AFTER")
            ) -> dict[str, Any]:
    """The comparison of two run reports, as ``--json OUT`` writes it (see docs/run.md,
    "Compare two runs"); ``exit_code`` is 0, or :data:`FAILED` where a rule asked for failed."""
    syncs = _syncs(before, after)
    chance = noise(before, after)
    unlike = _unlike(before, after)
    rules = []
    if fail_on_new_syncs:
        rules.append(_new_syncs_rule(before, after, syncs))
    if fail_if_slower is not None:
        rules.append(_slower_rule(before, after, fail_if_slower, chance))
    for rule in rules:  # a rule cannot pass on runs that are not alike: that is said first
        rule["passed"] = rule["passed"] and not unlike
        rule["why"] = [*unlike, *rule["why"]]
    warnings = []
    if os.path.normpath(before["script"]) != os.path.normpath(after["script"]):
        warnings.append(f"BEFORE ran {before['script']} and AFTER ran {after['script']}: the "
                        "reports are of different scripts (compared all the same)")
    return {
        "compare": COMPARE,
        "unlike": unlike,
        "before": _side(before, paths[0]),
        "after": _side(after, paths[1]),
        "speed_ratio": (after["steps_per_s"] / before["steps_per_s"]
                        if before["steps_per_s"] > 0 else None),
        "speed_noise": chance,
        "verdict_changed": before["verdict"] != after["verdict"],
        "losses": _losses(before["losses"], after["losses"]),
        "syncs": syncs,
        **_job(before, after),
        "rules": rules,
        "warnings": warnings,
        "exit_code": FAILED if any(not rule["passed"] for rule in rules) else 0,
    }


def _job(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Where either is a torchrun job's report: ``world_size`` and ``straggler`` (before, after;
    None: a single process's), ``collectives`` compared as the sync sites."""
    if "ranks" not in before and "ranks" not in after:
        return {}
    return {"world_size": [before.get("world_size"), after.get("world_size")],
            "straggler": [before.get("straggler"), after.get("straggler")],
            "collectives": _syncs(before, after, "collectives")}


def _side(report: dict[str, Any], path: str) -> dict[str, Any]:
    return {"path": path, "script": report["script"], "steps": report["steps"],
            "steps_per_s": report["steps_per_s"], "verdict": report["verdict"]}


def _unlike(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Why the two runs are not alike, so that no rule can pass on them: a script that failed
    (its exit code not 0), a run that found no training step, AFTER with fewer steps than
    BEFORE (it stopped early, or ran less: a crashed run is fast and reads little)."""
    said = [f"{name}'s script exited {report['exit_code']} (it failed: its figures are of a run "
            "cut short)" for name, report in (("BEFORE", before), ("AFTER", after))
            if report["exit_code"] != 0]
    said += [f"{name} found no training step" for name, report in (("BEFORE", before),
                                                                     ("AFTER", after))
             if report["steps"] == 0]
    if 0 < after["steps"] < before["steps"]:
        said.append(f"AFTER found {after['steps']} steps, fewer than BEFORE's {before['steps']} "
                    "(it stopped early, or ran less)")
    return said


# -- sync sites ------------------------------------------------------------------------------

def _syncs(before: dict[str, Any], after: dict[str, Any],
           key: str = "syncs") -> dict[str, Any] | None:
    """The sites removed, added, changed (count or per step) and ``moved?``, how many are the
    same and which of those moved (:func:`~.sitematch.match`); None where either report counted
    none (``syncs: null``). ``key``: the rows compared (``"collectives"``: a job's)."""
    if before.get(key) is None or after.get(key) is None:
        return None
    return match(before[key], after[key])


# -- the rules -------------------------------------------------------------------------------

def more_often(old_count: int, old_steps: int, new_count: int, new_steps: int) -> bool:
    """Whether a site reads more often per step after than before. With the same number of
    steps (or none before): a higher count. Else more than one read above what the earlier rate
    gives over the later steps, ``new > old * new_steps / old_steps + 1``, in integers: a read
    every N steps, or once at the first step, rounds to one read more or less with another step
    count, and is not more often for that."""
    if old_steps == new_steps or old_steps == 0:
        return new_count > old_count
    return new_count * old_steps > old_count * new_steps + old_steps


def _new_syncs_rule(before: dict[str, Any], after: dict[str, Any],
                    syncs: dict[str, Any] | None) -> dict[str, Any]:
    """``--fail-on-new-syncs``: fails where AFTER reads in steps at a site BEFORE did not read
    in steps, or more often (:func:`more_often`; a ``moved?`` pair's two rates)."""
    rule = "--fail-on-new-syncs"
    if syncs is None:
        which = " and ".join(name for name, report in (("BEFORE", before), ("AFTER", after))
                             if report["syncs"] is None)
        return {"rule": rule, "passed": False,
                "why": [f"cannot check: {which} counted no sync sites (syncs: null; the sync "
                        "audit was not available)"]}
    why = []
    for change in syncs["changes"]:
        old, new = change["before"], change["after"]
        if not change["in_step"] or new is None:
            continue
        name = _named(change, new["site"])
        if old is None:
            why.append(f"{name} reads in steps ({_rate_text(new, after['steps'])}), a site "
                       "BEFORE did not read in steps")
        elif more_often(old["count"], before["steps"], new["count"], after["steps"]):
            moved = "" if old["site"] == new["site"] else f" (moved? from {old['site']})" \
                if change["change"] == "moved?" else f" ({old['site']} BEFORE)"
            why.append(f"{name}{moved} reads more often in steps: "
                       f"{_rate_text(new, after['steps'])}, BEFORE "
                       f"{_rate_text(old, before['steps'])}")
    said = why or ["no site reads in steps where BEFORE did not, nor more often"]
    return {"rule": rule, "passed": not why, "why": said}


def _rate_text(figures: dict[str, Any], steps: int) -> str:
    return f"{figures['count']} in {steps} steps, {figures['per_step']:.2f} a step"


def _slower_rule(before: dict[str, Any], after: dict[str, Any], pct: float,
                 chance: dict[str, Any] | None) -> dict[str, Any]:
    """``--fail-if-slower PCT``: fails where AFTER's steps/s is more than PCT % below BEFORE's
    (and where BEFORE found no steps: nothing to measure against); its why says where the
    difference is within the noise the step times show (``chance``)."""
    rule = f"--fail-if-slower {pct:g}"
    old, new = before["steps_per_s"], after["steps_per_s"]
    if old <= 0:
        return {"rule": rule, "passed": False,
                "why": ["cannot check: BEFORE found no steps (0 steps/s), so there is no speed "
                        "to compare with"]}
    drop = (old - new) / old * 100
    passed = new >= old * (1 - pct / 100)
    if passed:
        how = f"{abs(drop):.1f}% {'slower' if drop > 0 else 'faster'}" if round(drop, 1) \
            else "the same speed"
    else:
        how = f"{drop:.1f}% slower, more than the {pct:g}% allowed"
    return {"rule": rule, "passed": passed,
            "why": [f"AFTER {figure(new)} steps/s against BEFORE {figure(old)}: {how}"
                    + (f" ({_chance(chance)})" if chance is not None else "")]}


def _chance(chance: dict[str, Any]) -> str:
    """Whether a speed difference is within the noise the step times show."""
    return (f"{'within' if chance['within'] else 'beyond'} the noise of "
            f"\u00b1{chance['pct']:.1f}% the step times show")


# -- losses ----------------------------------------------------------------------------------

def _losses(old: list[float | None], new: list[float | None]) -> dict[str, Any]:
    """``agree``: ``"equal"`` (the same length, every step's loss the same, nulls included) or
    ``"differ"``, with the largest absolute difference over the steps both hold a loss for and
    its step, and the steps where one holds a loss and the other null."""
    common = min(len(old), len(new))
    pairs = [(abs(a - b), step) for step, (a, b) in enumerate(zip(old, new, strict=False))
             if a is not None and b is not None]
    largest = max(pairs, key=lambda pair: (pair[0], -pair[1]), default=None)
    return {"agree": "equal" if old == new else "differ",
            "before_steps": len(old), "after_steps": len(new), "compared_steps": common,
            "max_abs_diff": largest[0] if largest is not None else None,
            "at_step": largest[1] if largest is not None else None,
            "null_in_one": [step for step in range(common)
                            if (old[step] is None) != (new[step] is None)]}


# -- the text --------------------------------------------------------------------------------

def text(found: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> str:
    """The comparison as printed on stdout."""
    old, new = found["before"], found["after"]
    scripts = (old["script"] if old["script"] == new["script"]
               else f"{old['script']} -> {new['script']}")
    lines = [f"asyncthrottle compare: {old['path']} -> {new['path']} ({scripts})"]
    if found["unlike"]:
        lines.append(f"  NOT ALIKE: {'; '.join(found['unlike'])}: the figures below compare "
                     "unlike runs" + (", and no rule can pass" if found["rules"] else ""))
    lines += [_speed(found), f"  verdict: {old['verdict']} -> {new['verdict']}"
              + ("" if found["verdict_changed"] else " (unchanged)"),
              _loss_line(found["losses"], before["losses"], after["losses"])]
    lines += _sync_lines(found["syncs"], before, after)
    if "straggler" in found:
        lines += _job_lines(found, before, after)
    for rule in found["rules"]:
        state = "passed" if rule["passed"] else "FAILED"
        lines.append(f"  {rule['rule']}: {state}: {rule['why'][0]}")
        lines += [f"    {why}" for why in rule["why"][1:]]
    return "\n".join(lines)


def _speed(found: dict[str, Any]) -> str:
    old, new, ratio = found["before"], found["after"], found["speed_ratio"]
    steps = f"steps {old['steps']} -> {new['steps']}"
    chance = found.get("speed_noise")
    if ratio is None:
        said = "no ratio: BEFORE found no steps"
    elif chance is not None and chance["within"]:
        said = (f"x{ratio:.2f}: within the noise of \u00b1{chance['pct']:.1f}% the step times "
                "show, no faster nor slower that they can tell")
    else:
        said = f"x{ratio:.2f}, {(ratio - 1) * 100:+.0f}%" + (
            f", {_chance(chance)}" if chance is not None else "")
    return (f"  speed: {figure(old['steps_per_s'])} -> {figure(new['steps_per_s'])} steps/s "
            f"({said}); {steps}")


def _loss_line(found: dict[str, Any], old: list[float | None], new: list[float | None]) -> str:
    if found["agree"] == "equal":
        return f"  loss: equal ({found['before_steps']} steps)"
    said = [f"  loss: differ ({found['before_steps']} steps before, {found['after_steps']} "
            "after)"]
    if found["max_abs_diff"] is not None:
        step = found["at_step"]
        said.append(f"largest difference {found['max_abs_diff']:.4g} at step {step} ("
                    f"{old[step]:.6g} -> {new[step]:.6g}) over {found['compared_steps']} "
                    "common steps")
    elif found["compared_steps"]:
        said.append("no step holds a loss in both")
    if found["null_in_one"]:
        steps = steps_named(found["null_in_one"])
        said.append(f"a loss in one only (null in the other) at steps {steps}")
    return ": ".join(said[:2]) + "".join(f"; {part}" for part in said[2:])


def _job_lines(found: dict[str, Any], before: dict[str, Any],
               after: dict[str, Any]) -> list[str]:
    """The ranks, the straggler and the collectives of two job reports."""
    old, new = found["world_size"]
    said = [_straggler(found) for found in found["straggler"]]
    return [f"  ranks: {old or 1} -> {new or 1}", f"  straggler: {said[0]} -> {said[1]}",
            *_sync_lines(found["collectives"], before, after, "collectives")]


def _straggler(found: dict[str, Any] | None) -> str:
    if found is None:
        return "none"
    return f"rank {found['rank']} ({found['phase']}, {found['cost_fraction']:.0%})"


def _sync_lines(syncs: dict[str, Any] | None, before: dict[str, Any],
                after: dict[str, Any], key: str = "syncs") -> list[str]:
    what = "sync sites" if key == "syncs" else key
    if syncs is None:
        which = " and ".join(name for name, report in (("BEFORE", before), ("AFTER", after))
                             if report.get(key) is None)
        return [f"  {what}: not compared ({which} counted none: {key} is null)"]
    changes = syncs["changes"]
    kinds = [kind for kind in ("removed", "added", "changed", "moved?")
             if any(c["change"] == kind for c in changes)]
    counted = [f"{sum(c['change'] == kind for c in changes)} {kind}" for kind in kinds]
    same = f"{syncs['unchanged']} the same" + (f", {len(syncs['moved'])} of them at another line"
                                               if syncs["moved"] else "")
    if not changes:
        return [f"  {what}: no change ({same})"]
    cells = [(c["change"], _where(c), _named(c), _count(c["before"]), _count(c["after"]),
              "" if c["in_step"] else "  outside steps") for c in changes]
    heads = ("change", "site", "call", "before", "after")
    widths = [max(len(row[k]) for row in [heads, *cells]) for k in range(5)]
    lines = [f"  {what} ({', '.join(counted)}; {same}):"]
    for row in [heads, *cells]:
        line = "  ".join(f"{cell:<{w}}" for cell, w in zip(row[:5], widths, strict=True))
        lines.append(f"    {line}{row[5] if len(row) > 5 else ''}".rstrip())
    return lines


def _where(change: dict[str, Any]) -> str:
    old, new = change["before"], change["after"]
    if old is not None and new is not None and old["site"] != new["site"]:
        return f"{old['site']} -> {new['site']}"
    return str((old or new)["site"])


def _named(change: dict[str, Any], site: str | None = None) -> str:
    """The call, with the framework's line that made the read; with ``site``, the site first."""
    call = change["call"] + (f" (in {change['via']})" if change["via"] else "")
    return f"{site} {call}" if site is not None else call


def _count(figures: dict[str, Any] | None) -> str:
    return "-" if figures is None else f"{figures['count']}, {figures['per_step']:.2f}/step"


# -- the command -----------------------------------------------------------------------------

def _percent(value: str) -> float:
    try:
        pct = float(value)
    except ValueError:
        pct = -1.0
    if not math.isfinite(pct) or pct < 0:
        raise argparse.ArgumentTypeError(f"--fail-if-slower takes a percent >= 0 (5 fails "
                                         f"AFTER more than 5% slower), got {value!r}")
    return pct


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command("compare"),
        description=textwrap.fill(
            "Compare two reports of run --json (before and after an edit of the script): steps/s "
            "and their ratio, the sync sites removed, added and changed, the verdicts, and "
            "whether the losses agree. Exit status: 0, 1 where a --fail-* rule failed, 2 for a "
            "file that is no run report or a usage error.", 79),
        epilog=examples(("run --json before.json train.py", "before the edit"),
                        ("run --json after.json train.py", "after it"),
                        ("compare before.json after.json", "what changed"),
                        ("compare before.json after.json --fail-on-new-syncs --fail-if-slower 10",
                         "")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", metavar="BEFORE.json", help="the earlier run's --json report")
    parser.add_argument("after", metavar="AFTER.json", help="the later run's --json report")
    parser.add_argument("--fail-on-new-syncs", action="store_true",
                        help="exit 1 where AFTER reads in steps at a site BEFORE did not read in "
                             "steps, or more often per step")
    parser.add_argument("--fail-if-slower", metavar="PCT", type=_percent, default=None,
                        help="exit 1 where AFTER's steps/s is more than PCT%% below BEFORE's")
    parser.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Compare two run reports and print what changed; returns the exit status: 0, 1
    (:data:`FAILED`) where a ``--fail-*`` rule failed, 2 (:data:`UNUSABLE`) for a file that is
    no run report or an ``--json OUT`` that cannot be written (a usage error exits 2 too)."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        before, after = load(args.before, "BEFORE"), load(args.after, "AFTER")
    except ReportError as exc:
        print(f"{command('compare')}: {exc}", file=sys.stderr)
        return UNUSABLE
    found = compare(before, after, fail_on_new_syncs=args.fail_on_new_syncs,
                    fail_if_slower=args.fail_if_slower, paths=(args.before, args.after))
    for warning in found["warnings"]:
        print(f"{command('compare')}: warning: {warning}", file=sys.stderr)
    print(text(found, before, after))
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{command('compare')}: --json {args.json!r} could not be written ({exc}): "
                  "name a file in a folder that exists and that you can write to", file=sys.stderr)
            return UNUSABLE
    return int(found["exit_code"])
