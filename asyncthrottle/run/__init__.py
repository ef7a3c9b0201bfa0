"""``python -m asyncthrottle run [OPTIONS] SCRIPT [ARGS...]``: diagnose an unchanged training
script."""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from collections.abc import Sequence

from .._typed import command, examples
from .guard import GUARD_EXIT
from .job import RANKS_TIMEOUT_S
from .record import LIMIT

__all__ = ["main"]

# the usage after the command as typed (asyncthrottle._typed.command)
_USAGE = "run [--json PATH] [--html PATH] [--trace PATH] [--suggest PATH] [--events PATH] " \
         "[--depth N] [--max-syncs-per-step N] [--ranks-timeout S] [--] (SCRIPT | -m MODULE) " \
         "[ARGS...]"
_REPLAY_USAGE = "run [--json PATH] [--html PATH] [--trace PATH] [--suggest PATH] " \
                "[--max-syncs-per-step N] --replay PATH"
# run's options that take a value (the script's own arguments come after SCRIPT)
_VALUED = ("--json", "--html", "--trace", "--suggest", "--events", "--replay", "--depth",
           "--max-syncs-per-step", "--ranks-timeout")
_EXITS = (f"exit code: the script's own; 2: a usage error, or a script that cannot be opened; "
          f"{GUARD_EXIT}: --max-syncs-per-step failed (a line over the limit, or no training step "
          f"found) where the script itself exited 0")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command("run"), usage=f"{command(_USAGE)}\n       {command(_REPLAY_USAGE)}",
        description=textwrap.fill(
            "Run a PyTorch training script unchanged, as python would, and report on stderr at "
            "its exit: its steps, loss, verdict, sections, input wait, the lines that read device "
            "values (sync sites) and what to change.", 79),
        epilog=examples(
            ("run train.py --lr 0.1", "the script's own arguments follow it"),
            ("run --suggest fix.patch train.py", "the certain fixes as a patch"),
            ("run --json before.json train.py", "the report as JSON, for compare"),
            ("run --max-syncs-per-step 0 train.py", "CI: fail on a read in the steps"),
            ("run -m mypackage.train", "a module, as python -m runs it"),
            ("run --events run.jsonl train.py", "the run's record, to share"),
            ("run --replay run.jsonl", "its report again, without the script"))
        + "\nwhat the report's words mean: the glossary of docs/run.md (\"Diagnose a script\")"
        + "\n\n" + textwrap.fill(_EXITS, 79),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON (schema 1)")
    parser.add_argument("--html", metavar="PATH",
                        help="also write the report as one self-contained HTML page (no network: "
                             "attach it to an issue)")
    parser.add_argument("--trace", metavar="PATH",
                        help="write a Chrome/Perfetto trace of the steps (ui.perfetto.dev, or "
                             "python -m asyncthrottle plot PATH)")
    parser.add_argument("--suggest", metavar="PATH",
                        help="write the suggested rewrites that are certain (a value read only to "
                             "be logged, a NaN check) as one patch: apply it in the script's "
                             "folder with patch -p1 < PATH or git apply PATH")
    parser.add_argument("--events", metavar="PATH",
                        help="also write the run's record: what the hooks heard, as JSON lines "
                             f"(its first {LIMIT:,} events); --replay PATH makes the report "
                             "again from it, without the script (attach it to an issue)")
    parser.add_argument("--replay", metavar="PATH",
                        help="make the report again from a record written by --events, without "
                             "the script (on the CPU: the recorded host times, no device times)")
    parser.add_argument("--depth", metavar="N", type=_depth, default=None,
                        help="throttle the steps at depth N (an int >= 1); default: only observe, "
                             "never block")
    parser.add_argument("--max-syncs-per-step", metavar="N", type=_limit, default=None,
                        help="a CI check, with no GPU too: fail (exit code "
                             f"{GUARD_EXIT}) when a line in the training steps reads device "
                             "values more than N times a step on average (a number >= 0, e.g. "
                             "0 or 0.5), or when no step is found; a script that fails keeps "
                             "its own exit code")
    parser.add_argument("--ranks-timeout", metavar="S", type=_seconds, default=RANKS_TIMEOUT_S,
                        help="under torchrun: the seconds rank 0 waits, once its script ended, "
                             "for the other ranks' reports before it reports the job without "
                             f"them (default {RANKS_TIMEOUT_S:g})")
    parser.add_argument("-m", metavar="MODULE", dest="module",
                        help="run a library module as a script, as python -m does")
    return parser


def _depth(value: str) -> int:
    try:
        depth = int(value)
    except ValueError:
        depth = 0
    if depth < 1:
        raise argparse.ArgumentTypeError(f"--depth must be an int >= 1, got {value!r} (leave it "
                                         "out to only observe)")
    return depth


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"--ranks-timeout must be a finite number of seconds > 0, got {value!r}, e.g. 60")
    return seconds


def _limit(value: str) -> float:
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if not 0 <= limit < math.inf:
        raise argparse.ArgumentTypeError(
            f"--max-syncs-per-step must be a finite number >= 0, got {value!r}: the reads a "
            "line may make in a step on average, e.g. 0 (none) or 0.5 (every other step)")
    return limit


def _typed(own: list[str], module: str | None) -> list[str]:
    """run's own options as typed, for the report (``-m MODULE`` is the script's part)."""
    if module is not None:
        own = own[:-2] if own[-2:] == ["-m", module] else own[:-1]
    return own


def _split(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """run's own options, the script (None with ``-m`` or none given) and the script's
    arguments; ``--`` ends run's options, ``-mMODULE`` is ``-m MODULE``."""
    k = 0
    while k < len(argv):
        arg = argv[k]
        if arg == "--":
            return argv[:k], (argv[k + 1] if k + 1 < len(argv) else None), argv[k + 2:]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            end = k + 2 if arg == "-m" else k + 1
            return argv[:end], None, argv[end:]
        if arg in _VALUED:
            k += 2
        elif arg.startswith("-") and arg != "-":
            k += 1
        else:
            return argv[:k], arg, argv[k + 1:]
    return argv, None, []


def _output(parser: argparse.ArgumentParser, option: str, value: str | None) -> str | None:
    """``--json``/``--html``/``--trace``/``--suggest``'s file made absolute (where the command
    was typed, whatever the script's ``os.chdir``); a path that cannot be written is a usage
    error, before the script runs."""
    if value is None:
        return None
    path = os.path.abspath(value)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        problem = f"is a folder; name a file in it, e.g. {os.path.join(value, 'report.json')}"
    elif not os.path.isdir(folder):
        problem = f"is in a folder that does not exist ({folder}); create it first or name a " \
                  "file in an existing folder"
    elif not os.access(folder, os.W_OK) or (os.path.exists(path)
                                            and not os.access(path, os.W_OK)):
        problem = "cannot be written here (permission denied); name a file in a folder you can " \
                  "write to"
    else:
        return path
    parser.error(f"{option} {value!r} {problem}")


def _replayed_alone(parser: argparse.ArgumentParser, options: argparse.Namespace,
                    script: str | None, rest: list[str]) -> None:
    """``--replay`` runs no script: one named, ``-m``, ``--depth`` or ``--events`` beside it is a
    usage error."""
    if script is not None or options.module is not None or rest:
        parser.error(f"--replay {options.replay!r} runs no script: leave out "
                     f"{script or '-m ' + str(options.module or rest[0])!r}")
    for name, value in (("--depth", options.depth), ("--events", options.events)):
        if value is not None:
            parser.error(f"--replay {options.replay!r} runs no script, so {name} has nothing to "
                         f"do: leave out {name} {value}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script and print the report; returns the script's exit status (2: a usage error,
    or a script that cannot be opened, as python says; :data:`~.guard.GUARD_EXIT` where
    ``--max-syncs-per-step`` failed and the script exited 0).

    Raises:
        KeyboardInterrupt: the script ended by Ctrl-C; raised after the report, so that python
            ends the process as it would have ended the script's (threads joined, ``atexit``
            handlers run, then killed by SIGINT).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    own, script, rest = _split(args)
    options = parser.parse_args(own)
    if options.replay is not None:
        _replayed_alone(parser, options, script, rest)
    elif script is None and options.module is None:
        parser.error("name the script to run: SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    json_path = _output(parser, "--json", options.json)
    trace_path = _output(parser, "--trace", options.trace)
    html_path = _output(parser, "--html", options.html)
    suggest_path = _output(parser, "--suggest", options.suggest)
    events_path = _output(parser, "--events", options.events)
    from .session import Options, replay, session

    chosen = Options(depth=options.depth, json=json_path, html=html_path, trace=trace_path,
                     suggest=suggest_path, typed=_typed(own, options.module),
                     max_syncs_per_step=options.max_syncs_per_step, events=events_path,
                     ranks_timeout=options.ranks_timeout, command=command())
    if options.replay is not None:
        return replay(chosen, options.replay)
    target = options.module or script
    assert target is not None
    return session(chosen, target, rest, module=options.module is not None)
