"""``parts/_declared.py`` is what ``python -m asyncthrottle.parts._declare`` writes from the
declarations, and a new part takes its own module (with its test and its docs line) and nothing
written by hand elsewhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import asyncthrottle
from asyncthrottle.parts import _declare
from asyncthrottle.parts._build import Part

PACKAGE = Path(asyncthrottle.__file__).parent


def test_the_listings_are_written_from_the_declarations() -> None:
    assert _declare.PATH.read_text() == _declare.text(), (
        "asyncthrottle/parts/_declared.py is stale: run python -m asyncthrottle.parts._declare")


def test_the_check_says_stale_and_shows_the_difference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "_declared.py"
    stale.write_text(_declare.text().replace("    SampleRate,  # 130\n", ""))
    monkeypatch.setattr(_declare, "PATH", stale)
    assert _declare.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert "+    SampleRate,  # 130" in out and "is stale: run python -m asyncthrottle.parts._declare" in err
    assert _declare.main([]) == 0 and _declare.main(["--check"]) == 0
    assert stale.read_text() == _declare.text()
    assert _declare.main(["--write"]) == 2


class _Twin(Part):
    PLACE = 10


@pytest.mark.parametrize(("place", "error", "says"), [
    (10, ValueError, "share PLACE = 10"), ("10", TypeError, "PLACE must be an int"),
    (True, TypeError, "PLACE must be an int"),
])
def test_a_place_is_one_int_of_one_part(monkeypatch: pytest.MonkeyPatch, place: object, error: type,
                                        says: str) -> None:
    from asyncthrottle.parts import samples
    monkeypatch.setattr(_Twin, "PLACE", place)
    monkeypatch.setattr(_Twin, "__module__", samples.__name__)
    monkeypatch.setattr(samples, "_Twin", _Twin, raising=False)
    with pytest.raises(error, match=says):
        _declare.parts()


WIDGETS = '''
"""Widgets (``widget_every=``): a part added for the test, as a contributor adds one."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .._options import Option, check_int
from ._build import Part

if TYPE_CHECKING:
    from ..core.rule import Core
    from ..stats import Stats
    from ._build import Build


@dataclasses.dataclass(frozen=True)
class WidgetStats:
    """Its field of Stats."""

    widgets: int | None = None


class Widgets(Part):
    """Counts every ``widget_every``-th step."""

    __slots__ = ("core", "every")
    PLACE = 135
    OPTIONS = (
        Option("widget_every", "int | None", None, "count every k-th step", "",
               lambda name, value: check_int(name, value, minimum=1, rule="an int >= 1 or None",
                                             fix="e.g. widget_every=2"),
               wrong_type=("2",), wrong_value=(0,),
               help="count every k-th step as a widget (None: off)."),
    )
    STATS = WidgetStats

    @classmethod
    def build(cls, at: Build) -> Widgets | None:
        every = at.options["widget_every"]
        return None if every is None else cls(at.core, every)

    def __init__(self, core: Core, every: int) -> None:
        self.core, self.every = core, every

    def fields(self) -> dict[str, Any]:
        return {"widgets": self.core.steps // self.every}

    @staticmethod
    def summary_lines(stats: Stats) -> list[str]:
        return [] if stats.widgets is None else [f"  widgets: {stats.widgets}"]
'''

USE = '''
import inspect
import asyncthrottle as at
from asyncthrottle.parts import OPTIONS, PARTS

thr = at.Throttle(device="cpu", widget_every=2)
for _ in thr.wrap(range(5)):
    pass
assert thr.stats.widgets == 2, thr.stats
assert "  widgets: 2" in thr.summary().splitlines(), thr.summary()
assert at.Throttle(device="cpu").stats.widgets is None
parameter = inspect.signature(at.Throttle).parameters["widget_every"]
assert (parameter.annotation, parameter.default, parameter.kind) == ("int | None", None, parameter.KEYWORD_ONLY)
assert "widget_every: count every k-th step as a widget (None: off)." in inspect.getdoc(at.Throttle.__init__)
assert PARTS[-1].__name__ == "Widgets" and "widget_every" in {option.name for option in OPTIONS}
try:
    at.Throttle(device="cpu", widget_every=0)
except ValueError as error:
    assert "widget_every" in str(error) and "widget_every=2" in str(error), error
else:
    raise AssertionError("widget_every=0 was accepted")
print("used")
'''


def test_a_new_part_is_its_module_and_the_written_listings(tmp_path: Path) -> None:
    """A copy of the package with one module added (``parts/widgets.py``): the command writes the
    listings, and the throttle takes the keyword, checks it, shows its field and its summary line, and its
    signature and docstring name it. Nothing else in the package changed."""
    copy = tmp_path / "asyncthrottle"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "parts" / "widgets.py").write_text(textwrap.dedent(WIDGETS))
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120, check=False)

    stale = run("-m", "asyncthrottle.parts._declare", "--check")
    assert stale.returncode == 1 and "+    Widgets,  # 135" in stale.stdout, stale.stdout + stale.stderr
    wrote = run("-m", "asyncthrottle.parts._declare")
    assert wrote.returncode == 0, wrote.stderr
    used = run("-c", USE)
    assert used.returncode == 0 and used.stdout == "used\n", used.stdout + used.stderr
    changed = sorted(str(path.relative_to(copy)) for path in copy.rglob("*.py")
                     if "__pycache__" not in path.parts
                     and (not (PACKAGE / path.relative_to(copy)).exists()
                          or (PACKAGE / path.relative_to(copy)).read_bytes() != path.read_bytes()))
    assert changed == ["parts/_declared.py", "parts/widgets.py"], changed
