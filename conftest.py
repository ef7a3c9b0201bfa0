"""The whole session's settings: one OpenMP thread a torch process, and the doctests of the
package's modules (a module whose optional framework is not installed is not collected: importing
it raises ModuleNotFoundError with its install hint, by design)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

# One OpenMP thread a process that imports torch: pytest-xdist runs a worker a core, and without
# this each worker, and each process a test starts, would run a torch thread a core, so the cores
# are oversubscribed and OpenMP's waiting threads spin on them (CPU time that does no work: about
# 15% of the suite's outside tests/run, whose scripts already run with one). Set before any module
# imports torch, and inherited by the workers and every process the tests start; a value already
# set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_NEEDS = {
    "asyncthrottle/lightning.py": "lightning",
    "asyncthrottle/transformers.py": "transformers",
}

collect_ignore = [path for path, module in _NEEDS.items()
                  if importlib.util.find_spec(module) is None]

# What `.ci/run`'s second pass runs, in a venv without the optional frameworks
# (`pytest -m "frameworks or smoke"`): every test of a module that names one of them (what must
# skip, never fail, without it; and what tests their absence), and a small smoke set of the core.
_FRAMEWORKS = re.compile(r"\b(lightning|transformers|accelerate|timm)\b")
_SMOKE = ("tests/test_throttle.py", "tests/core/test_rule.py", "tests/run/test_run.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    named: dict[Path, bool] = {}
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path))
        if path not in named:
            named[path] = bool(_FRAMEWORKS.search(path.read_text(errors="replace")))
        if named[path]:
            item.add_marker(pytest.mark.frameworks)
        if path.relative_to(root).as_posix() in _SMOKE:
            item.add_marker(pytest.mark.smoke)
    _balance(config, items)


# pytest-xdist balanced by recorded durations (coverage.py's tests do this too): with `--dist
# worksteal` each worker starts on an equal count of tests, in order, and a worker that runs out
# steals from the end of the other's. Left in file order, the suite's few long end-to-end tests
# (2% of its tests, half its time) can fall to one worker or to the end; here each worker's share
# starts with long tests dealt by recorded time (the longest to the share with the least so far),
# then the short ones in file order (module fixtures stay together). `pytest --record-durations`
# rewrites the record; a test it does not know counts as short.
_DURATIONS = Path(__file__).resolve().parent / "tests" / "durations.json"
_LONG_S = 1.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test's duration of at least {_LONG_S / 2} s to "
                          f"{_DURATIONS.name}, which orders the tests across xdist's workers")


def _shares(items: list[pytest.Item], seconds: dict[str, float], workers: int) -> list[pytest.Item]:
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):  # as xdist hands out the first tests
        sizes.append(left // remaining)
        left -= sizes[-1]
    long = sorted((i for i in items if seconds.get(i.nodeid, 0) >= _LONG_S),
                  key=lambda item: -seconds[item.nodeid])
    shares: list[list[pytest.Item]] = [[] for _ in sizes]
    totals = [0.0 for _ in sizes]
    for item in long:
        share = min((s for s in range(workers) if len(shares[s]) < sizes[s]),
                    key=lambda s: totals[s])
        shares[share].append(item)
        totals[share] += seconds[item.nodeid]
    dealt = set(map(id, long))
    short = iter(i for i in items if id(i) not in dealt)
    for share, size in zip(shares, sizes, strict=True):
        share.extend(next(short) for _ in range(size - len(share)))
    return [item for share in shares for item in share]


def _balance(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers < 2 or not _DURATIONS.exists():
        return
    items[:] = _shares(items, json.loads(_DURATIONS.read_text()), workers)


class _Recorder:
    """Sums each test's setup, call and teardown time (on xdist's controller: its workers'
    reports arrive there) and writes the long ones at the session's end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {k: round(v, 1) for k, v in sorted(self.seconds.items()) if v >= _LONG_S / 2}
        _DURATIONS.write_text(json.dumps(kept, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "record-durations")
