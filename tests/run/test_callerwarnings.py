"""A warning raised inside the runner's read wrappers is the script's line's, as without the
runner: its module (``filterwarnings(..., module=...)``), file, line and registry."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from asyncthrottle.audit.callerwarnings import CallerWarnings
from asyncthrottle.audit.patches import Patches

SCRIPT = "fake_script_module"
WRAPPERS = "fake_wrappers_module"


def module(name: str, source: str, **names: Any) -> ModuleType:
    """A module ``name`` made from ``source`` (its file: ``<name>.py``), with ``names``."""
    made = ModuleType(name)
    made.__file__ = f"{name}.py"
    made.__dict__.update(names)
    exec(compile(source, made.__file__, "exec"), made.__dict__)
    return made


@contextlib.contextmanager
def caller_warnings(name: str) -> Iterator[CallerWarnings]:
    patches = Patches()
    before = list(warnings.filters)
    filter = CallerWarnings(name)
    try:
        filter.start(patches)
        yield filter
    finally:
        patches.undo()
    assert warnings.filters == before


# a wrapper between the script and "torch": the warning names the wrapper's frame, as a C++
# warning names the innermost Python frame
WRAPPER = """\
import warnings

def wrapper(front):
    front()
    warnings.warn("torch's deprecation", UserWarning)
    return 1
"""
# the script's line that calls the wrapper
STEP = "def step(front):\n    return wrapper(front)\n"


def script(wrapper: Callable[..., Any]) -> ModuleType:
    return module(SCRIPT, STEP, wrapper=wrapper)


def test_a_script_s_error_filter_for_its_module_raises_the_wrapper_s_warning() -> None:
    step = script(module(WRAPPERS, WRAPPER).wrapper).step
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module=SCRIPT)
        with caller_warnings(WRAPPERS) as filter, pytest.raises(UserWarning, match="torch's"):
            step(filter.front)
        # without the runner's filter, the module the warning names is the wrapper's
        with pytest.warns(UserWarning) as got:
            assert step(lambda: None) == 1
        assert [w.filename for w in got] == [f"{WRAPPERS}.py"]


def test_the_warning_is_shown_at_the_script_s_line_once_as_python_shows_it() -> None:
    made = script(module(WRAPPERS, WRAPPER).wrapper)
    with caller_warnings(WRAPPERS) as filter, warnings.catch_warnings(record=True) as got:
        # the script's own filter goes before the runner's: the wrapper's call puts it first
        warnings.simplefilter("default")
        made.step(filter.front)
        made.step(filter.front)
    assert [(w.filename, w.lineno, str(w.message), w.category) for w in got] == [
        (f"{SCRIPT}.py", 2, "torch's deprecation", UserWarning)]
    assert list(made.__warningregistry__)[1:] == [("torch's deprecation", UserWarning, 2)]


def test_an_ignored_warning_stays_ignored_and_other_warnings_are_as_they_were() -> None:
    made = script(module(WRAPPERS, WRAPPER).wrapper)
    with caller_warnings(WRAPPERS) as filter, warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=SCRIPT)
        made.step(filter.front)
        warnings.warn("elsewhere", RuntimeWarning, stacklevel=1)
    assert [(w.filename, str(w.message)) for w in got] == [(__file__, "elsewhere")]


def test_a_warning_of_the_wrappers_module_raised_from_no_frame_of_it_is_left_alone() -> None:
    with caller_warnings(WRAPPERS), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        warnings.warn_explicit("named so", UserWarning, "x.py", 3, module=WRAPPERS)
    assert [(w.filename, w.lineno) for w in got] == [("x.py", 3)]


@pytest.fixture
def counting() -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    from asyncthrottle.audit.syncsites import SyncSites

    audit, patches = SyncSites([__file__.rpartition("/")[0]]), Patches()
    try:
        audit.start(patches)
        audit.in_step = True
        yield torch
    finally:
        audit.stop()
        patches.undo()


# indexing by a uint8 mask: torch deprecates it, in the runner's indexing wrapper
INDEX = "def step(torch):\n    x = torch.arange(3.0)\n    return x[torch.ones(3, dtype=torch.uint8)]\n"


def test_under_the_audit_torch_s_warning_in_a_read_is_the_script_s(counting: Any) -> None:
    made = module(SCRIPT, INDEX)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        made.step(counting)
    assert {(w.filename, w.lineno) for w in got} == {(f"{SCRIPT}.py", 3)}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module=SCRIPT)
        with pytest.raises(UserWarning, match="uint8"):
            made.step(counting)


def test_the_filter_reads_as_a_filter_and_is_first_while_on() -> None:
    with caller_warnings(WRAPPERS) as filter:
        first: Any = warnings.filters[0]
        assert first is filter.entry and WRAPPERS in repr(first)
