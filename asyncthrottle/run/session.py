"""One ``run``: the hooks installed, the script run, the hooks undone, the report written."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..audit.patches import Patches
from ..audit.syncsites import SyncSites
from ..framework import ThrottleHooks
from .collectives import Collectives
from .dynamo import keep_out
from .environment import environment
from .guard import exit_code, judge
from .hardexit import report_before_exit
from .html import render as page
from .imports import after_import
from .job import RANKS_TIMEOUT_S, Job, job
from .jobreport import report_job
from .outputs import suggest, write
from .record import Record
from .recording import RecordingSteps
from .replay import read, replay_steps
from .report import collect
from .script import Ending, locate, run, say, set_path0
from .sigterm import Terminated
from .steps import SAMPLE_EVERY, Steps
from .text import text

__all__ = ["Options", "replay", "session", "write_report"]

logger = logging.getLogger("asyncthrottle")

# --trace keeps the timeline of this many recent steps
TRACE_STEPS = 10_000
# under torchrun: the ranks' step times are gathered every this many steps
RANKS_EVERY = 10


class Options:
    """``run``'s options: ``depth`` (None: observe only), ``json``, ``html`` and ``trace`` paths,
    ``max_syncs_per_step`` (the guard's limit; None: no guard), ``typed``: all of them as typed
    (``["--json", "r.json"]``), ``suggest``: the patch's path (None: none written), ``events``:
    the record's path (None: no record kept), ``ranks_timeout``: under torchrun, the seconds
    rank 0 waits for the other ranks' reports; ``command``: how run was started, as typed
    (``asyncthrottle`` or ``python -m asyncthrottle``: :func:`~asyncthrottle._typed.command`,
    read before the script gets ``sys.argv``), which the report's command lines say."""

    def __init__(self, depth: int | None = None, json: str | None = None,
                 trace: str | None = None, max_syncs_per_step: float | None = None,
                 html: str | None = None, typed: list[str] | None = None,
                 suggest: str | None = None, events: str | None = None,
                 ranks_timeout: float = RANKS_TIMEOUT_S,
                 command: str = "python -m asyncthrottle") -> None:
        self.depth, self.json, self.html, self.trace = depth, json, html, trace
        self.suggest, self.events, self.ranks_timeout = suggest, events, ranks_timeout
        # the options as typed: the report's ``options``
        self.typed = list(typed or [])
        self.max_syncs_per_step = max_syncs_per_step
        self.command = command


def _rank() -> tuple[int, int] | None:
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return (int(os.environ.get("RANK", "0") or 0), world) if world > 1 else None


def _throttle_options(options: Options, ranks: Job | None) -> dict[str, Any]:
    # nonfinite=None: the report finds NaN/Inf in the delivered losses; nothing warns or raises
    # into the script; the ranks' scores only where no job's report names the straggler
    return {"trace": TRACE_STEPS if options.trace else 0, "nonfinite": None,
            "sample_every": SAMPLE_EVERY,
            "ranks_every": RANKS_EVERY if _rank() is not None and ranks is None else None}


def _job() -> Job | None:
    """This rank's job (None: not under torchrun); a store that cannot be reached is said, and
    this rank reports alone."""
    try:
        found = job(os.environ)
        if found is not None:
            found.start()
    except Exception as exc:
        say(f"python -m asyncthrottle run (rank {os.environ.get('RANK')}): the job's store at "
            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} cannot be reached "
            f"({exc}); this rank reports alone\n")
        return None
    return found


def _sites(file: str) -> SyncSites:
    """The sync audit over the script's folder."""
    return SyncSites([str(Path(file).resolve().parent)])


def session(options: Options, target: str, args: list[str], module: bool) -> int:
    """Run the script under the hooks and report; returns the script's exit status (2: a
    script that cannot be opened, 1: a module, folder or zipapp with nothing to run, as python
    says; :data:`~.guard.GUARD_EXIT`: the script exited 0 and ``max_syncs_per_step`` failed).
    A script that calls ``os._exit`` is reported inside that call, and the process dies with
    this status there (:mod:`.hardexit`).

    Raises:
        KeyboardInterrupt: after the report, where the script ended by Ctrl-C (see
            :meth:`Ending.exit`).
    """
    set_path0(target, module)
    try:
        file = locate(target, module)
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        say(f"python -m asyncthrottle run: {exc}\n")
        return 2 if isinstance(exc, FileNotFoundError) else 1
    sites = _sites(file)
    # the sites' folder (and the patch's), before the script's os.chdir
    root = str(Path(file).resolve().parent)
    ranks = _job()
    thr_options = _throttle_options(options, ranks)

    def make(device: Any) -> ThrottleHooks:
        # the device of the first step's tensors: a CPU script on a GPU machine never starts CUDA
        return ThrottleHooks(options.depth, device=device, **thr_options)

    # the record is kept on every run (bounded): the report's steps are its classifier's;
    # --events writes it
    record = Record()
    steps = RecordingSteps(make, sites, record=record, collective=_rank() is not None,
                           grow=options.events is None)
    patches = Patches()
    argv = [target, *args] if not module else ["-m", target, *args]
    collectives = Collectives([root], lambda: sites.in_step) if _rank() is not None else None
    terminated = Terminated()
    if ranks is not None:
        terminated.install()

    def finish() -> None:
        # from here on, torchrun's SIGTERM waits for the report
        terminated.reporting = True
        try:
            steps.finish()
        finally:
            if sites is not None:
                sites.stop()
            patches.undo()

    def hard_exit(code: int) -> int:
        # os._exit(code): no atexit, no finally, no stdout flushed (as under python)
        finish()
        ran = getattr(sys.modules.get("__main__"), "__file__", None)
        return report(Ending(code, file=ran if isinstance(ran, str) else None), flush=False)

    # JAX imported by the script (not by whatever ran before it in this process): its steps and
    # reads run does not hear, which the report says
    jax_before = sys.modules.get("jax") is not None

    def report(ending: Ending, *, flush: bool = True) -> int:
        shown = ending.file if module and ending.file else file
        if not jax_before and sys.modules.get("jax") is not None:
            steps.seen["jax"] = 1
        _write_record(record, options, steps, shown, argv, root=root, code=ending.code)
        data = _data(steps, sites, options, shown, ending, argv)
        if ranks is not None:
            return report_job(ranks, data, steps, collectives, options, root, ending, terminated,
                              flush=flush)
        if collectives is not None:
            data["collectives"] = collectives.rows(_count(steps))
        data = _written(data, steps, options, root=root, flush=flush)
        # after the report: exit() raises KeyboardInterrupt where the script ended by Ctrl-C
        return exit_code(ending.exit(), data)

    try:
        _install(steps, sites, patches, options, thr_options, collectives)
        report_before_exit(patches, hard_exit)
        ending = run(target, args, module)
    finally:
        finish()
    return report(ending)


def _write_record(record: Record, options: Options, steps: Steps, shown: str,
                  argv: list[str], *, root: str, code: int) -> None:
    """Write ``--events``' record of the run that ended with ``code`` (none without it)."""
    if options.events is None:
        return
    head = {"script": shown, "argv": argv, "roots": [root], "root": root,
            "options": options.typed}
    end = {"exit_code": code, "seen": steps.seen}
    write("--events", _per_rank(options.events, _rank()),
          lambda: "\n".join(record.lines(head, end)) + "\n")


def replay(options: Options, path: str) -> int:
    """The report of the run recorded at ``path`` (``run --events``), made again without the
    script (``--json``, ``--html``, ``--trace``, ``--suggest``, ``--max-syncs-per-step`` as for a
    run); returns the recorded run's exit status, or :data:`~.guard.GUARD_EXIT` where the guard
    fails and it was 0; 2 where ``path`` is no record (said on stderr)."""
    try:
        replayed = replay_steps(read(path), trace=options.trace is not None)
    except (OSError, ValueError) as exc:
        say(f"python -m asyncthrottle run: --replay {path!r}: {exc}\n")
        return 2
    head, end = replayed.head, replayed.end
    if end.get("dropped"):
        say(f"python -m asyncthrottle run: the record kept the run's first {head.get('limit')} "
            f"events and dropped {end['dropped']}: this report is of its beginning\n")
    options.typed = list(head.get("options") or [])
    code = int(end.get("exit_code") or 0)
    data = write_report(replayed.steps, replayed.sites, options, str(head.get("script")),
                        Ending(code), list(head.get("argv") or []), root=str(head.get("root")))
    return exit_code(code, data)


def _install(steps: Steps, sites: Any, patches: Patches, options: Options,
             thr_options: dict[str, Any], collectives: Collectives | None) -> None:
    """The torch hooks, the frameworks' watch and the sync audit, installed once the script
    imports torch (never before its first line: an ``OMP_NUM_THREADS`` or ``CUDA_VISIBLE_DEVICES``
    it sets at its top still counts)."""
    def torch_imported(torch: ModuleType) -> None:
        from .frameworks import watch
        from .torchhooks import install

        install(steps, patches)
        watch(steps, patches, lambda cls: cls(options.depth, **thr_options))
        if sites is not None:
            sites.start(patches)
        if collectives is not None and torch.distributed.is_available():
            collectives.install(torch.distributed, patches)
        keep_out(patches)

    after_import({"torch": torch_imported}, patches)


def _data(steps: Steps, sites: Any, options: Options, file: str, ending: Ending,
          argv: list[str]) -> dict[str, Any]:
    """The report's data, judged by ``--max-syncs-per-step``."""
    rows = sites.rows(max(1, _count(steps))) if sites is not None else None
    data = collect(steps, rows, script=file, code=ending.code, argv=argv, raised=ending.raised)
    data.update(judge(data, options.max_syncs_per_step))
    data["options"], data["command"] = options.typed, options.command
    data["environment"] = environment(_device(steps, data), _rank(),
                                      on_host=data.get("synchronous") is True)
    return data


def write_report(steps: Steps, sites: Any, options: Options, file: str, ending: Ending,
                 argv: list[str], *, root: str, flush: bool = True) -> dict[str, Any]:
    """Write the report of ``steps`` (stderr, ``--json``, ``--html``, ``--suggest``'s patch);
    returns its data. ``flush``: the script's stdout first (not where it called ``os._exit``,
    which flushes nothing)."""
    return _written(_data(steps, sites, options, file, ending, argv), steps, options, root=root,
                    flush=flush)


def _written(data: dict[str, Any], steps: Steps, options: Options, *, root: str,
             flush: bool = True) -> dict[str, Any]:
    """Write the report (stderr, ``--json``, ``--html``, ``--suggest``'s patch); returns its
    data. ``flush``: the script's stdout first (not where it called ``os._exit``, which flushes
    nothing). Under torchrun with no job's store, each rank writes its own files
    (``name.rank<r>.json``)."""
    rank = _rank()
    main = max(steps.sources, key=lambda s: s.hooks.throttle.stats.steps, default=None)
    slowest = _slowest(main, rank)
    data["trace"] = _trace(main, options.trace, rank)
    patch = suggest(data, root)
    write("--suggest", _per_rank(options.suggest, rank), lambda: patch)
    write("--json", _per_rank(options.json, rank), lambda: json.dumps(data, indent=1) + "\n")
    write("--html", _per_rank(options.html, rank), lambda: page(data))
    # the script's last lines first (a closed or replaced stdout: nothing to flush)
    try:
        if flush:
            sys.stdout.flush()
    except Exception:
        pass
    say(text(data, rank=rank, slowest=slowest) + "\n")
    return data


def _slowest(main: Any, rank: tuple[int, int] | None) -> str | None:
    """Rank 0's line on the slowest rank of a torchrun (None elsewhere)."""
    if main is None or (rank is not None and rank[0] != 0):
        return None
    gathered = main.hooks.throttle.stats
    if gathered.slowest_rank is None:
        return None
    scores = ", ".join(f"{score:.2f}" for score in gathered.rank_scores or ())
    return f"{gathered.slowest_rank} (each rank's speed against the fastest: {scores})"


def _trace(main: Any, path: str | None, rank: tuple[int, int] | None) -> dict[str, Any] | None:
    """Write ``--trace`` where steps were found; the report's ``trace``: its absolute path and
    whether it was written (None without ``--trace``)."""
    if path is None:
        return None
    where = os.path.abspath(_per_rank(path, rank) or path)
    written = main is not None and main.hooks.throttle.stats.steps > 0
    if written:
        try:
            main.hooks.throttle.export_trace(where)
        except OSError as exc:
            say(f"python -m asyncthrottle run: --trace {where!r} could not be written ({exc})\n")
            written = False
    return {"path": where, "written": written}


def _device(steps: Steps, data: dict[str, Any]) -> Any:
    """The device the steps ran on: the runner's first step's, else the CPU where the steps'
    throttle was synchronous (None: not known)."""
    if steps.device is not None:
        return steps.device
    return "cpu" if data.get("synchronous") else None


def _count(steps: Steps) -> int:
    return max((s.steps for s in steps.sources), default=0)


def _per_rank(path: str | None, rank: tuple[int, int] | None) -> str | None:
    """Rank r > 0 of a torchrun with no job's store writes ``name.rank<r>.json`` beside rank 0's
    ``name.json``."""
    if path is None or rank is None or rank[0] == 0:
        return path
    where = Path(path)
    return str(where.with_name(f"{where.stem}.rank{rank[0]}{where.suffix}"))
