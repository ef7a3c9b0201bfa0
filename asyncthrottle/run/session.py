"""One ``run``: the hooks installed, the script run, the hooks undone, the report written."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ..framework import ThrottleHooks
from .patches import Patches
from .report import collect, text
from .script import Ending, locate, run
from .steps import Steps

__all__ = ["Options", "session"]

logger = logging.getLogger("asyncthrottle")

# --trace keeps the timeline of this many recent steps
TRACE_STEPS = 10_000
# under torchrun: the ranks' step times are gathered every this many steps
RANKS_EVERY = 10


class Options:
    """``run``'s options: ``depth`` (None: observe only), ``json`` and ``trace`` paths."""

    def __init__(self, depth: int | None = None, json: str | None = None,
                 trace: str | None = None) -> None:
        self.depth, self.json, self.trace = depth, json, trace


def _rank() -> tuple[int, int] | None:
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return (int(os.environ.get("RANK", "0") or 0), world) if world > 1 else None


def _throttle_options(options: Options) -> dict[str, Any]:
    # nonfinite=None: the report finds NaN/Inf in the delivered losses; nothing warns or raises
    # into the script
    return {"trace": TRACE_STEPS if options.trace else 0, "nonfinite": None,
            "ranks_every": RANKS_EVERY if _rank() is not None else None}


def _sites(file: str) -> Any:
    """The sync audit over the script's folder, or None where its module is missing."""
    try:
        module = importlib.import_module("asyncthrottle.run.syncsites")
    except ImportError:
        return None
    return module.SyncSites([str(Path(file).resolve().parent)])


def session(options: Options, target: str, args: list[str], module: bool) -> int:
    """Run the script under the hooks and report; returns the script's exit status."""
    file = locate(target, module)
    sites = _sites(file)
    thr_options = _throttle_options(options)

    def make() -> ThrottleHooks:
        return ThrottleHooks(options.depth, **thr_options)

    steps = Steps(make, sites, collective=_rank() is not None)
    patches = Patches()
    try:
        _install(steps, patches, options, thr_options)
        if sites is not None:
            sites.start()
        ending = run(target, args, module)
    finally:
        try:
            steps.finish()
        finally:
            if sites is not None:
                sites.stop()
            patches.undo()
    _report(steps, sites, options, file, ending, [target, *args] if not module
            else ["-m", target, *args])
    return ending.exit()


def _install(steps: Steps, patches: Patches, options: Options,
             thr_options: dict[str, Any]) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        logger.warning("asyncthrottle run: torch is not installed: no steps can be found")
        return
    from .frameworks import watch
    from .torchhooks import install

    install(steps, patches)
    watch(steps, patches, lambda cls: cls(options.depth, **thr_options))


def _report(steps: Steps, sites: Any, options: Options, file: str, ending: Ending,
            argv: list[str]) -> None:
    rows = sites.rows(max(1, _count(steps))) if sites is not None else None
    data = collect(steps, rows, script=file, code=ending.code, argv=argv)
    slowest = None
    rank = _rank()
    main = max(steps.sources, key=lambda s: s.hooks.throttle.stats.steps, default=None)
    if main is not None and (rank is None or rank[0] == 0):
        gathered = main.hooks.throttle.stats
        if gathered.slowest_rank is not None:
            scores = ", ".join(f"{score:.2f}" for score in gathered.rank_scores or ())
            slowest = f"{gathered.slowest_rank} (each rank's speed against the fastest: {scores})"
    if options.trace and main is not None:
        main.hooks.throttle.export_trace(_per_rank(options.trace, rank))
    if options.json:
        Path(_per_rank(options.json, rank)).write_text(json.dumps(data, indent=1) + "\n")
    sys.stdout.flush()
    print(text(data, rank=rank, slowest=slowest), file=sys.stderr, flush=True)


def _count(steps: Steps) -> int:
    return max((s.hooks.throttle.stats.steps for s in steps.sources), default=0)


def _per_rank(path: str, rank: tuple[int, int] | None) -> str:
    """Rank r > 0 of a torchrun writes ``name.rank<r>.json`` beside rank 0's ``name.json``."""
    if rank is None or rank[0] == 0:
        return path
    where = Path(path)
    return str(where.with_name(f"{where.stem}.rank{rank[0]}{where.suffix}"))
