"""``python -m asyncthrottle run [OPTIONS] SCRIPT [ARGS...]``: diagnose an unchanged training
script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]

_USAGE = "python -m asyncthrottle run [--json PATH] [--trace PATH] [--depth N] " \
         "(SCRIPT | -m MODULE) [ARGS...]"
# run's options that take a value (the script's own arguments come after SCRIPT)
_VALUED = ("--json", "--trace", "--depth")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m asyncthrottle run", usage=_USAGE,
        description="Run a PyTorch training script unchanged, as python would, and report on "
                    "stderr at its exit: its steps, loss, verdict, sections, input wait, the "
                    "lines that read device values (sync sites) and what to change.")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON (schema 1)")
    parser.add_argument("--trace", metavar="PATH",
                        help="write a Chrome/Perfetto trace of the steps (ui.perfetto.dev, or "
                             "python -m asyncthrottle plot PATH)")
    parser.add_argument("--depth", metavar="N", type=_depth, default=None,
                        help="throttle the steps at depth N (an int >= 1); default: only observe, "
                             "never block")
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


def _split(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """run's own options, the script (None with ``-m`` or none given) and the script's
    arguments."""
    k = 0
    while k < len(argv):
        arg = argv[k]
        if arg == "-m":
            return argv[:k + 2], None, argv[k + 2:]
        if arg in _VALUED:
            k += 2
        elif arg.startswith("-") and arg != "-":
            k += 1
        else:
            return argv[:k], arg, argv[k + 1:]
    return argv, None, []


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script and print the report; returns the script's exit status (2: a usage error,
    or a script that cannot be opened, as python says)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    own, script, rest = _split(args)
    options = parser.parse_args(own)
    if script is None and options.module is None:
        parser.error("name the script to run: SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    from .script import locate
    from .session import Options, session

    chosen = Options(depth=options.depth, json=options.json, trace=options.trace)
    target = options.module or script
    assert target is not None
    try:
        locate(target, options.module is not None)
    except FileNotFoundError as exc:
        print(f"python -m asyncthrottle run: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"python -m asyncthrottle run: {exc}", file=sys.stderr)
        return 1
    return session(chosen, target, rest, module=options.module is not None)
