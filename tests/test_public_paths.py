"""Every public import path keeps working, and every old module path either warns or is a public home.

Each check that depends on what was imported before runs in a fresh interpreter: the old paths and the
light import are about a first import.
"""

from __future__ import annotations

import importlib
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import asyncthrottle
from asyncthrottle._aliases import MOVED

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {
    "asyncthrottle": [
        "AutoDepth", "Block", "Deferred", "DonatedValueError", "Event", "EventFactory", "Hybrid", "MemoryBudget",
        "NonFiniteError", "NonFiniteWarning", "Poll", "Spin", "Stats", "Subscriber", "SyncAdvice",
        "SyncError", "Throttle", "ThrottleTimeout", "Throttled", "WaitStrategy", "throttle",
    ],
    "asyncthrottle.lightning": ["ThrottleCallback", "ThrottleProgressBar"],
    "asyncthrottle.transformers": ["ThrottleCallback"],
    "asyncthrottle.jax": ["barrier_on", "jax_events"],
    "asyncthrottle.framework": ["ThrottleHooks"],
    "asyncthrottle.testing": ["FakeDevice", "FakeClock", "FakeEvent", "forbid_syncs", "SyncError"],
    "asyncthrottle.simulated": ["SimulatedDevice"],
    "asyncthrottle.procdevice": ["ProcessDevice"],
    "asyncthrottle.core": ["Core", "Subscriber"],
    "asyncthrottle.memory": ["cuda_probe"],
    "asyncthrottle.syncaudit": ["SyncAdvice"],
    "asyncthrottle.plot": ["plot_trace"],
    "asyncthrottle.bench": [],
}
# What `import asyncthrottle` must leave unimported.
HEAVY = ("torch", "jax", "numpy", "tqdm", "lightning", "transformers", "matplotlib")
# Flags of the command line, each of which must stay.
FLAGS = {
    "bench": ["--overhead", "--waits", "--values", "--backend", "--experiments", "--depths", "--scale", "--repeat",
              "--wait", "--sim-cost", "--json", "--plot"],
    "plot": ["--output", "--title", "trace"],
}


# the public modules of an optional framework, and the framework each needs
_NEEDS = {"asyncthrottle.lightning": "lightning", "asyncthrottle.transformers": "transformers"}


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_path_imports(module: str) -> None:
    if module in _NEEDS:
        pytest.importorskip(_NEEDS[module])
    loaded = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(loaded, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_top_level_exports_what_it_lists() -> None:
    assert sorted(asyncthrottle.__all__) == asyncthrottle.__all__
    assert not set(PUBLIC["asyncthrottle"]) - set(asyncthrottle.__all__)
    assert not [name for name in asyncthrottle.__all__ if not hasattr(asyncthrottle, name)]
    assert asyncthrottle.Subscriber is importlib.import_module("asyncthrottle.core").Subscriber
    assert asyncthrottle.SyncAdvice is importlib.import_module("asyncthrottle.syncaudit").SyncAdvice


def test_the_version_is_the_projects() -> None:
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and asyncthrottle.__version__ == version.group(1)


def test_the_lightning_callbacks_pickled_path_never_moves() -> None:
    pytest.importorskip("lightning")
    from asyncthrottle.lightning import ThrottleCallback

    path = f"{ThrottleCallback.__module__}.{ThrottleCallback.__qualname__}"
    assert path == "asyncthrottle.lightning.ThrottleCallback"
    data = pickle.dumps(ThrottleCallback)
    assert b"asyncthrottle.lightning" in data and pickle.loads(data) is ThrottleCallback


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_the_command_line_keeps_its_flags(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncthrottle.__main__ import main

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert not [flag for flag in FLAGS[command] if flag not in shown]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_gives_the_new_module(old: str) -> None:
    new, moved = MOVED[old]
    code = f"""
import importlib, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module("asyncthrottle.{old}")
assert module is importlib.import_module("asyncthrottle.{new}"), module
found = [w for w in caught if issubclass(w.category, DeprecationWarning) and "asyncthrottle.{old}" in str(w.message)]
print(len(found), found[0].message if found else "")
"""
    done = _python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    count, _, message = done.stdout.strip().partition(" ")
    if moved is not None:
        major, minor = moved.split(".")
        gone = f"goes away in {major}.{int(minor) + 1}"
        assert count == "1" and f"asyncthrottle.{new}" in message and gone in message, done.stdout
    else:
        assert count == "0", f"asyncthrottle.{old} is a public home and must not warn: {done.stdout}"


def test_an_old_path_warns_at_the_importing_line() -> None:
    done = _python("import warnings; warnings.simplefilter('error'); import asyncthrottle.passes")
    assert done.returncode != 0 and "DeprecationWarning" in done.stderr and 'line 1' in done.stderr, done.stderr


@pytest.mark.parametrize("how", ["import asyncthrottle.passes", "from asyncthrottle import passes",
                                 "import importlib; importlib.import_module('asyncthrottle.passes')"])
def test_an_old_path_warning_is_shown_by_default_at_the_users_line(how: str, tmp_path: Path) -> None:
    """Python shows a DeprecationWarning under its default filters only when it is attributed to __main__."""
    done = _python(f"import sys\n{how}")
    assert "<string>:2: DeprecationWarning: asyncthrottle.passes moved" in done.stderr, done.stderr
    script = tmp_path / "train.py"
    script.write_text(f"import sys\n\n{how}\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert f"{script}:3: DeprecationWarning" in done.stderr, done.stderr


def test_an_old_path_leaves_the_new_module_as_it_was() -> None:
    done = _python("""
import importlib, warnings
import asyncthrottle.view as view
spec = view.__spec__
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import asyncthrottle.passes
assert asyncthrottle.passes is view and view.__spec__ is spec, view.__spec__
old = view.Pass
assert importlib.reload(view) is view and view.Pass is not old  # the reload ran the module again
""")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_library_runs_under_warnings_as_errors_after_the_old_paths_were_imported() -> None:
    done = subprocess.run([sys.executable, "-W", "error", "-c", f"""
import importlib, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for old in {sorted(MOVED)!r}:
        importlib.import_module("asyncthrottle." + old)
import asyncthrottle as at
for device in ("jax", "cpu"):
    thr = at.Throttle(2, device=device)
    for i in thr.wrap(range(3)):
        thr.defer(float(i), name="loss")
    assert thr.latest == {{"loss": 2.0}}, thr.latest
"""], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_import_stays_light() -> None:
    done = _python(f"import asyncthrottle, sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
