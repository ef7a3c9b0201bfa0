"""Running a test script under ``python -m asyncthrottle run`` and as plain ``python``, in
subprocesses, and reading what its lines say it reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import forked
import pytest
from once import once

from asyncthrottle.run.report import schema
from asyncthrottle.run.validate import problems

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]
# a line's own statement of its host read: "# host-device sync: Tensor.item 1.0" (per step, in
# steps) or "# host-device sync: Tensor.tolist outside 1" (a count, outside steps)
_SAID = re.compile(r"[#;] host-device sync: (\S+) (?:(outside) (\d+)|([\d.]+))")
_SCHEMA = schema()


def env() -> dict[str, str]:
    # the scripts import this checkout's package, whatever is installed
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


_TORCH = forked.TORCH


def python(*args: str, cwd: Path = SCRIPTS, timeout: float = 300, fresh: bool = False,
           preload: tuple[str, ...] = _TORCH) -> subprocess.CompletedProcess[bytes]:
    """``python ARGS``, forked from a server that has imported ``preload`` (:mod:`forked`), or a
    fresh interpreter with ``fresh=True`` (a test of what only a fresh process shows)."""
    return forked.run(args, cwd=cwd, env=env(), timeout=timeout, fresh=fresh, preload=preload)


def start(*args: str, cwd: Path = SCRIPTS, fresh: bool = False,
          preload: tuple[str, ...] = _TORCH) -> Done:
    """``python ARGS`` started (as :func:`python`); ``wait()`` gives its
    :class:`subprocess.CompletedProcess`."""
    return Done(forked.start(args, cwd=cwd, env=env(), fresh=fresh, preload=preload))


def pair(plain: tuple[str, ...], run: tuple[str, ...], cwd: Path = SCRIPTS,
         timeout: float = 300, fresh: bool = False) -> tuple[
             subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    """``python PLAIN`` and ``python RUN`` at once (as :func:`python`)."""
    first, second = start(*plain, cwd=cwd, fresh=fresh), start(*run, cwd=cwd, fresh=fresh)
    return first.wait(timeout), second.wait(timeout)


class Done:
    """A started process; ``wait()`` collects it (returncode, stdout, stderr)."""

    def __init__(self, process: forked.Forked | subprocess.Popen[bytes]) -> None:
        self.process = process

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        return subprocess.CompletedProcess(self.process.args, self.process.returncode or 0,
                                           out, err)


def valid(report: dict[str, Any]) -> dict[str, Any]:
    """``report``, once it is valid against run's report schema (``report.schema.json``): every
    report a test makes passes here, checked by ``jsonschema`` and by the package's own
    validator (``compare``'s). The schema accepts fields it does not describe (newer ones), so
    this also checks that it describes each of the report's fields: a field added to the report
    is added to ``report.schema.json``. (Where ``jsonschema`` is not installed -- the GPU
    machine, which installs nothing -- by the package's validator alone.)"""
    try:
        import jsonschema
    except ImportError:
        pass
    else:
        jsonschema.validate(report, _SCHEMA, cls=jsonschema.Draft202012Validator)
    assert problems(report, _SCHEMA) == []
    undescribed = sorted(set(report) - set(_SCHEMA["properties"]))
    loader = report.get("loader")
    if isinstance(loader, dict):  # the loader's own fields too
        undescribed += [f"loader.{key}" for key in sorted(
            set(loader) - set(_SCHEMA["$defs"]["loader"]["properties"]))]
    assert not undescribed, f"describe {undescribed} in asyncthrottle/run/report.schema.json"
    return report


def report_loader(batch_size: int | None, *, num_workers: int = 0, pin_memory: bool = False,
           in_effect: bool = False, batched_by: str | None = None) -> dict[str, Any]:
    """The report's ``loader`` of ``DataLoader(data, batch_size=..., num_workers=...,
    pin_memory=...)`` where torch pins or not (``in_effect``): without an accelerator
    ``pin_memory=True`` is off."""
    return {"num_workers": num_workers, "pin_memory": pin_memory,
            "pin_memory_in_effect": in_effect,
            "pin_memory_off": "no accelerator" if pin_memory and not in_effect else None,
            "batch_size": batch_size, "batched_by": batched_by}


def read_report(path: Path) -> dict[str, Any]:
    """The ``run --json`` report at ``path``, validated (:func:`valid`)."""
    return valid(json.loads(path.read_text()))


def under_run(script: str, tmp: Path, *args: str, fresh: bool = False,
              preload: tuple[str, ...] = _TORCH
              ) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any]]:
    """``python -m asyncthrottle run --json`` on the script (as :func:`python`); the process and
    its JSON report (validated; {} where none was written)."""
    report = tmp / "report.json"
    done = python("-m", "asyncthrottle", "run", "--json", str(report), script, *args, fresh=fresh,
                  preload=preload)
    return done, read_report(report) if report.exists() else {}


class SharedRuns:
    """Runs under ``python -m asyncthrottle run`` that several tests read, each made once a test
    session (:func:`once.once`, across pytest-xdist's workers too): keyed by the script, its
    arguments and whether run writes the page (``--html``). Each run's outputs lie in a folder of
    its own: ``report.json``, the record ``events.jsonl`` (``--events``) and, with ``html``,
    ``report.html``; an argument's ``{folder}`` is
    that folder (where the script writes what it writes). A test that reads a shared run only
    reads it (the process, the report, the files)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory

    def run(self, script: str, *args: str, html: bool = False) -> tuple[
            subprocess.CompletedProcess[bytes], dict[str, Any], Path]:
        """``run --json FOLDER/report.json [--html FOLDER/report.html] SCRIPT ARGS``, made at the
        session's first call: the process, its report (validated, {} where none was written) and
        FOLDER."""

        def make(folder: Path) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Any], Path]:
            report = folder / "report.json"
            page = ("--html", str(folder / "report.html")) if html else ()
            done = python("-m", "asyncthrottle", "run", "--json", str(report), "--events",
                          str(folder / "events.jsonl"), *page, script,
                          *(arg.format(folder=folder) for arg in args))
            return done, read_report(report) if report.exists() else {}, folder

        return once(self.factory, ("run", script, args, html), make)


def said_syncs(script: str) -> list[dict[str, Any]]:
    """The reads the script's lines say they make: site, call, in_step and per_step (in steps) or
    count (outside)."""
    said = []
    for number, line in enumerate((SCRIPTS / script).read_text().splitlines(), 1):
        # (a line of torch's call that reads twice says each: "...; host-device sync: ...")
        for found in _SAID.finditer(line):
            call, outside, count, per_step = found.groups()
            row: dict[str, Any] = {"site": f"{script}:{number}", "call": call,
                                   "in_step": outside is None}
            row.update({"count": int(count)} if outside else {"per_step": float(per_step)})
            said.append(row)
    return sorted(said, key=lambda row: (row["site"], row["call"], row["in_step"]))


def found_syncs(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's sync rows in :func:`said_syncs`' form."""
    rows = []
    for row in report["syncs"]:
        kept = {"site": row["site"], "call": row["call"], "in_step": row["in_step"]}
        kept.update({"per_step": round(row["per_step"], 3)} if row["in_step"]
                    else {"count": row["count"]})
        rows.append(kept)
    return sorted(rows, key=lambda row: (row["site"], row["call"], row["in_step"]))
