"""Each command's ``--help``: what it shows (an example), the command named as it was typed
(``asyncthrottle`` for the installed command, ``python -m asyncthrottle`` for ``python -m``), and
no option that moved out of the package. In-process: ``main(argv)``, with ``sys.argv[0]`` as each
way of starting it sets it."""

from __future__ import annotations

import re
import sys

import pytest

from asyncthrottle.__main__ import main
from asyncthrottle.bench.cli import _MOVED

# how each way of starting the command sets sys.argv[0]: the installed script's path, or (python -m)
# the package's __main__.py
STARTED = {"asyncthrottle": "/venv/bin/asyncthrottle",
           "python -m asyncthrottle": "/venv/lib/site-packages/asyncthrottle/__main__.py"}
COMMANDS = [[], ["run"], ["bench"], ["compare"], ["plot"], ["bench", "--overhead"],
            ["bench", "--values"], ["bench", "--waits"]]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("typed", sorted(STARTED))
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "top")
def test_the_usage_names_the_command_as_it_was_typed(
        typed: str, argv: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [STARTED[typed], *argv, "--help"])
    shown = _help(argv, capsys)
    usage = shown.partition("\n\n")[0]
    assert usage.startswith(f"usage: {' '.join([typed, *argv])}"), usage
    assert typed != "asyncthrottle" or "python -m" not in usage


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "top")
def test_each_command_s_help_shows_examples_of_it(
        argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [STARTED["asyncthrottle"]])
    shown = _help(argv, capsys)
    examples = shown[shown.index("\nexamples:\n"):].splitlines()[2:]
    command = " ".join(["asyncthrottle", *argv])
    assert [line for line in examples if line.startswith(f"  {command} ")], examples
    assert not [line for line in examples if "python -m asyncthrottle" in line], examples


def test_the_top_level_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    shown = _help([], capsys)
    assert all(re.search(rf"^  python -m asyncthrottle {name} ", shown, re.M)
               for name in ("run", "compare", "bench", "plot"))


def test_bench_help_lists_no_moved_option_and_a_moved_one_says_where_it_went(
        capsys: pytest.CaptureFixture[str]) -> None:
    shown = _help(["bench"], capsys)
    assert _MOVED and not [flag for flag in _MOVED if flag in shown]
    for flag, script in _MOVED.items():
        assert main(["bench", flag, "--quick"]) == 2
        assert f"run python {script} --quick from a clone" in capsys.readouterr().err


def test_run_help_points_to_the_glossary(capsys: pytest.CaptureFixture[str]) -> None:
    assert "docs/run.md" in _help(["run"], capsys)
