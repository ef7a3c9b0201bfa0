"""The user's line: where the library's warnings point."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from asyncthrottle._callers import warn_at_user


def test_a_warning_points_at_the_callers_line_each_time() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):
            warn_at_user("look here", UserWarning); line = sys._getframe().f_lineno  # noqa: E702
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)] * 2


@pytest.mark.parametrize("flags", [[], ["-W", "error::DeprecationWarning"]], ids=["default", "error"])
def test_a_warning_at_a_line_of_python_c_is_shown_not_an_import_error(flags: list[str]) -> None:
    """``__main__`` of ``python -c`` (and the REPL) has a loader without source: asking it raised
    ``ImportError: '__main__' is not a built-in module`` from the warning's call."""
    code = ("from asyncthrottle._callers import warn_at_user\n"
            "warn_at_user('old spelling', DeprecationWarning)\n"
            "print('went on')")
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "ImportError" not in done.stderr, done.stderr
    if flags:
        assert done.returncode == 1 and "DeprecationWarning: old spelling" in done.stderr, done.stderr
    else:
        assert done.returncode == 0 and "went on" in done.stdout, done.stderr
        assert "<string>:2: DeprecationWarning: old spelling" in done.stderr, done.stderr
