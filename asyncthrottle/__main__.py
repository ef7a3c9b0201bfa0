"""The ``asyncthrottle`` command line: ``python -m asyncthrottle bench|plot|run|compare [...]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._typed import command, examples

__all__ = ["main"]


def _examples() -> str:
    return examples(("run train.py --lr 0.1", "diagnose a script, unchanged"),
                    ("run --suggest fix.patch train.py", "... and write its fixes as a patch"),
                    ("compare before.json after.json", "what an edit changed"),
                    ("bench --backend simulated", "measure the throttle here"),
                    ("plot trace.json", "draw a --trace file"))


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; returns the process exit status.

    Example:
        ``python -m asyncthrottle bench --backend simulated --json``
    """
    from . import __version__

    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=command(),
        description="asyncthrottle: bound how far the host runs ahead of an asynchronous device.",
        epilog=_examples(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"asyncthrottle {__version__}")
    parser.add_argument("command", choices=["bench", "plot", "run", "compare"],
                        help="bench: measure the throttle on this machine (bench --help); plot: "
                             "draw an exported trace (plot --help); run: diagnose a training "
                             "script, unchanged (run --help); compare: what changed between two "
                             "run --json reports (compare --help)")
    if not args or args[0].startswith("-"):
        # --help, --version, or a usage error: exits
        parser.parse_args(args)
    # an unknown command: exits with the choices
    parser.parse_args(args[:1])
    if args[0] == "run":
        from .run import main as run_main

        return run_main(args[1:])
    if args[0] == "compare":
        from .run.compare import main as compare_main

        return compare_main(args[1:])
    if args[0] == "plot":
        from .plot import main as plot_main

        return plot_main(args[1:])
    from .bench.cli import main as bench_main

    return bench_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
