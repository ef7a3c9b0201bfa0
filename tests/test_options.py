"""Options follow one rule on every backend: a wrong type is a TypeError, a wrong value a ValueError."""

from __future__ import annotations

import dataclasses
import inspect
import re
import time
from pathlib import Path
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.parts import OPTIONS
from asyncthrottle.testing import FakeDevice


class _Stream:
    """What the throttle asks of a stream: wait_stream and wait_event, as torch.Stream has."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "stream"


# Each option's bad values, from its one declaration (Option.wrong_type, wrong_value), then the values that
# are bad only beside another option's.
WRONG_TYPE = [{option.name: value} for option in OPTIONS for value in option.wrong_type] + [
    {"depth": "auto", "max_depth": 2.5},
]
WRONG_VALUE = [{option.name: value} for option in OPTIONS for value in option.wrong_value] + [
    {"depth": at.AutoDepth(max=4), "max_depth": 4},
    {"max_memory": at.MemoryBudget(1 << 20, probe=lambda: 0), "memory": lambda: 0},
    {"timeout": 5.0, "wait": "block"},
    {"ranks_timeout": 60.0},  # without ranks_every=, no gather for it to bound
]
# The device's own options, each alone (the backends of the cases above pass device= or events=).
DEVICE = [({"device": 5}, TypeError), ({"device": "cdua"}, ValueError), ({"events": 5}, TypeError),
          ({"events": FakeDevice().event, "device": "cpu"}, ValueError)]
# The wrapper's options: wrap() and throttle().
WRAP = [({"to": 3}, TypeError), ({"to": "cdua"}, ValueError), ({"progress": 5}, TypeError),
        ({"progress": "yes"}, TypeError)]
# The options' values that are objects: their arguments are checked where they are made.
MADE = [
    (lambda: at.AutoDepth(max=0), ValueError, "AutoDepth max"),
    (lambda: at.AutoDepth(max=2.5), TypeError, "AutoDepth max"),
    (lambda: at.MemoryBudget(0), ValueError, "MemoryBudget bytes"),
    (lambda: at.MemoryBudget("1GB"), TypeError, "MemoryBudget bytes"),
    (lambda: at.MemoryBudget(1 << 20, probe=5), TypeError, "MemoryBudget probe"),
]


def _name(options: dict[str, Any]) -> str:
    # without the addresses of functions and objects: pytest-xdist's workers must collect the same ids
    return re.sub(r" at 0x[0-9a-fA-F]+", "", ",".join(f"{k}={v!r}" for k, v in options.items()))


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize("options", WRONG_TYPE, ids=_name)
def test_a_wrong_type_is_a_type_error_naming_the_option(options: dict[str, Any], backend: str) -> None:
    options = dict(options)
    depth = options.pop("depth", 2)
    with pytest.raises(TypeError, match=next(iter(options), "depth")):
        _make(backend, depth, options)


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize("options", WRONG_VALUE, ids=_name)
def test_a_wrong_value_is_a_value_error_naming_the_option(options: dict[str, Any], backend: str) -> None:
    options = dict(options)
    depth = options.pop("depth", 2)
    with pytest.raises(ValueError, match=next(iter(options), "depth")):
        _make(backend, depth, options)


@pytest.mark.parametrize(("call", "says"), [
    (lambda: at.Throttle(dpeth=2),
     r"^Throttle\(\) got an unexpected keyword argument 'dpeth' \(did you mean depth\?\)"),
    (lambda: at.Throttle(2, sample_evry=4, colour=1),
     r"^Throttle\(\) got unexpected keyword arguments 'sample_evry' \(did you mean sample_every\?\), 'colour'; "
     r"its keywords are depth, device, "),
    (lambda: at.throttle([0], 2, timout=5.0), r"^Throttle\(\) got .*'timout' \(did you mean timeout\?\)"),
    (lambda: at.Throttle(2, "cpu"),
     r"^Throttle\(\) takes 1 positional argument \(depth\) but 2 were given \(2, 'cpu'\); "
     r"pass the others by keyword: device=, events=, "),
    (lambda: at.Throttle(2, depth=3), r"^Throttle\(\) got depth twice, by position and as depth="),
])
def test_a_wrong_argument_names_the_throttle_and_the_closest_keyword(call: Any, says: str) -> None:
    """Python's own error named ``Keywords.__init__()``, the class the signature is written in, and no keyword
    near a misspelt one."""
    with pytest.raises(TypeError, match=says):
        call()


def test_a_subclass_is_named_in_its_wrong_argument() -> None:
    class Mine(at.Throttle):
        pass

    with pytest.raises(TypeError, match=r"^Mine\(\) got an unexpected keyword argument 'dpeth' \(did you mean depth"):
        Mine(dpeth=2)
    assert Mine(2, device="cpu").depth == 2


def test_the_signature_stays_the_declared_one_for_help_and_an_ide() -> None:
    assert list(inspect.signature(at.Throttle).parameters)[:3] == ["depth", "device", "events"]
    assert "Args:" in (inspect.getdoc(at.Throttle.__init__) or "")


def test_ranks_timeout_is_taken_with_ranks_every_and_its_default_alone() -> None:
    with pytest.raises(ValueError, match=r"ranks_timeout=60.0 was given without ranks_every=.*pass ranks_every="):
        FakeDevice().throttle(ranks_timeout=60.0)
    FakeDevice().throttle(ranks_every=10, ranks_timeout=60.0)
    FakeDevice().throttle(ranks_timeout=300.0)  # (the default: not told from no value)


def test_timeout_and_wait_with_depth_none_bound_the_drains_so_they_are_taken() -> None:
    """depth=None never waits for room, but drain() and the end of a pass wait for every step: timeout= and
    wait= act there, so neither is refused beside it."""
    dev = FakeDevice()
    thr = dev.throttle(None, timeout=0.5, wait="poll")
    with pytest.raises(at.ThrottleTimeout, match=r"within timeout=0\.5 s"):
        for _ in thr.wrap(range(3)):
            dev.launch(1.0)
    assert thr.stats.waits == 1


def test_the_parts_are_built_from_the_checked_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/architecture.md: a part's ``build(at)`` reads ``at.options``, all of them checked. Here the check of
    ``trace=`` returns another value than it was given: the part is built from the checked one."""
    from asyncthrottle import _lifecycle
    from asyncthrottle.parts.trace import Trace

    declared = [option if option.name != "trace" else dataclasses.replace(option, check=lambda name, value: 2 * value)
                for option in _lifecycle.OPTIONS]
    monkeypatch.setattr(_lifecycle, "OPTIONS", tuple(declared))
    built: list[Any] = []
    build = Trace.build.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Trace, "build",
                        classmethod(lambda cls, at: built.append(at.options["trace"]) or build(cls, at)))
    FakeDevice().throttle(trace=8)
    assert built == [16]


def test_a_close_miss_says_how_to_write_it() -> None:
    with pytest.raises(ValueError, match="write it detect_sync='warn'"):
        at.Throttle(device="cpu", detect_sync="Warn")
    with pytest.raises(ValueError, match="write it depth='auto'"):
        at.Throttle("Auto", device="cpu")


@pytest.mark.parametrize(("options", "error"), DEVICE, ids=[_name(o) for o, _ in DEVICE])
def test_the_device_options_are_refused_naming_them(options: dict[str, Any], error: type) -> None:
    with pytest.raises(error, match=next(iter(options))):
        at.Throttle(2, **options)


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize(("options", "error"), WRAP, ids=[_name(o) for o, _ in WRAP])
def test_the_wrappers_options_are_refused_naming_them(options: dict[str, Any], error: type, backend: str) -> None:
    with pytest.raises(error, match=next(iter(options))):
        _make(backend, 2, {}).wrap([0], **options)  # at the wrap, before any batch
    if backend == "cpu":
        with pytest.raises(error, match=next(iter(options))):
            at.throttle([0], device="cpu", **options)


@pytest.mark.parametrize(("make", "error", "names"), MADE, ids=[names + str(i) for i, (_, _, names) in enumerate(MADE)])
def test_an_options_object_is_refused_where_it_is_made_naming_the_argument(make: Any, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        make()


def _table() -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "depth-rule.md").read_text()
    table = text[text.index("The options, all keyword-only"):]
    return "\n".join(line for line in table.splitlines()[:40] if line.startswith("| `"))


def test_the_signature_is_the_declarations() -> None:
    """Throttle's keywords, their annotations and defaults are the options' declarations (an IDE and help()
    read the signature; each part declares its options once, in its OPTIONS)."""
    declared = {option.name: option for option in OPTIONS}
    parameters = dict(inspect.signature(at.Throttle).parameters)
    assert list(parameters) == [name for name in parameters if name in declared], "declared in the signature order"
    assert set(parameters) == set(declared), (
        f"in the signature, not declared: {sorted(set(parameters) - set(declared))}; declared, not in the "
        f"signature: {sorted(set(declared) - set(parameters))}")
    for name, parameter in parameters.items():
        option = declared[name]
        assert parameter.annotation == option.type, f"{name}: {parameter.annotation!r} != {option.type!r}"
        assert parameter.default is option.default or parameter.default == option.default, name
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if name == "depth" else inspect.Parameter.KEYWORD_ONLY
        assert parameter.kind == kind, name


def test_the_docstring_says_what_each_declared_option_is() -> None:
    """``Throttle.__init__``'s ``Args`` (help(Throttle), an IDE): each keyword, in the signature's order, with
    its declaration's ``help``."""
    doc = inspect.getdoc(at.Throttle.__init__) or ""
    args = doc[doc.index("Args:"):]
    named = re.findall(r"^    (\w+):", args, flags=re.MULTILINE)
    assert named == [name for name in inspect.signature(at.Throttle).parameters], named
    flat = " ".join(args.split())
    for option in OPTIONS:
        assert option.help, f"{option.name}: declare its help= (its entry in Args)"
        assert f"{option.name}: {' '.join(option.help.split())}" in flat, option.name


def test_the_options_table_is_the_declarations() -> None:
    """Each option's row of docs/depth-rule.md is its declaration's (Option.row()); a deprecated one is
    named in the table's row of deprecated options. ``depth``, the first argument, has its own paragraph."""
    rows = _table().splitlines()
    deprecated = next(row for row in rows if "deprecated in" in row)
    for option in OPTIONS:
        if option.deprecated is not None:
            assert f"`{option.name}=`" in deprecated or f"`Throttle({option.name}=)`" in deprecated, option.name
            assert option.deprecated in deprecated, f"{option.name}: say {option.deprecated} replaces it"
        elif option.name != "depth":
            assert option.row() in rows, f"depth-rule.md's table should have the row\n{option.row()}"


def test_every_option_has_a_bad_value() -> None:
    """A declaration names at least one value its check refuses (the device's: DEVICE below)."""
    devices = {name for options, _ in DEVICE for name in options}
    for option in OPTIONS:
        assert option.wrong_type or option.wrong_value or option.name in devices, option.name


@pytest.mark.parametrize("call", [at.Throttle.wrap, at.throttle], ids=["wrap", "throttle"])
def test_the_wrappers_keywords_are_in_the_options_table_and_in_the_bad_value_cases(call: Any) -> None:
    """wrap()'s and throttle()'s own keywords (throttle() takes the Throttle's too: their declarations)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    keywords = [name for name, p in inspect.signature(call).parameters.items()
                if p.kind in kinds and name not in ("self", "iterable", "depth")]
    cases = {name for options, _ in WRAP for name in options}
    listed = set(re.findall(r"`(\w+)=`", _table()))
    for name in keywords:
        assert name in cases, f"{call.__qualname__}'s keyword {name}= has no bad-value case in tests/test_options.py"
        assert name in listed, f"{call.__qualname__}'s {name}= is not in depth-rule.md's table"


@pytest.mark.parametrize("kind", [at.AutoDepth, at.MemoryBudget], ids=lambda kind: kind.__name__)
def test_every_argument_of_an_options_object_has_a_bad_value_case_and_the_table_names_it(kind: Any) -> None:
    for field in dataclasses.fields(kind):
        assert [names for _, _, names in MADE if names == f"{kind.__name__} {field.name}"], (
            f"{kind.__name__}({field.name}=) has no bad-value case in MADE")
    assert f"at.{kind.__name__}(" in _table(), f"depth-rule.md's table does not show {kind.__name__}"


def _make(backend: str, depth: Any, options: dict[str, Any]) -> at.Throttle:
    if backend == "cpu":
        return at.Throttle(depth, device="cpu", **options)
    dev = FakeDevice()
    return at.Throttle(depth, events=dev.event, clock=options.pop("clock", dev.clock), **options)


@pytest.mark.parametrize("streams", [[], 5, [1, 2]], ids=repr)
def test_streams_are_checked_alike_on_every_backend(streams: Any, fake_cuda: Any) -> None:
    """The check runs before the device is resolved: the CPU and CUDA refuse a value alike."""
    errors = []
    for device in ("cpu", "cuda", "jax"):
        with pytest.raises((TypeError, ValueError), match="streams") as caught:
            at.Throttle(2, device=device, streams=streams)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1] == errors[2], errors


# Arguments of the throttle's calls follow the same rule: (call, error, the argument it names).
CALLS = [
    (lambda thr: thr.section(""), ValueError, "section name"),
    (lambda thr: thr.section(5), TypeError, "section name"),
    (lambda thr: thr.section("forward", collective="yes"), TypeError, "collective"),
    (lambda thr: thr.section("forward", collective=1), TypeError, "collective"),
    (lambda thr: thr.end_step(failed="no"), TypeError, "failed"),
    (lambda thr: thr.end_step(failed=0), TypeError, "failed"),
    (lambda thr: thr.pause(at="x"), TypeError, "at"),
    (lambda thr: thr.pause(at=float("nan")), ValueError, "at"),
    (lambda thr: thr.pause(at=time.time()), ValueError, r"at.*time\.perf_counter\(\)"),
]


@pytest.mark.parametrize("backend", ["cpu", "fake"])
@pytest.mark.parametrize(("call", "error", "names"), CALLS, ids=[str(i) for i in range(len(CALLS))])
def test_a_calls_wrong_argument_is_refused_naming_it(call: Any, error: type, names: str, backend: str) -> None:
    thr = at.Throttle(2, device="cpu") if backend == "cpu" else FakeDevice().throttle(2)
    thr.section("forward", collective=True)  # made once: a second call must not take 1 for True
    thr.begin_step()
    with pytest.raises(error, match=names):
        call(thr)
    thr.end_step()  # a refused end_step() leaves the step open
    assert thr.stats.steps == 1
    thr.pause()
    assert thr.stats.wall_s < 3600  # not from an epoch timestamp
