"""How a wrapped pass ends: the same outcome for the same kind of exit, wherever the frame let go of it."""

from __future__ import annotations

import gc
import itertools
import math
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


def _prefetched(view: Iterable[int]) -> Iterator[int]:
    """A plain generator wrapper, as users write them (prefetchers, samplers, progress helpers)."""
    for x in view:  # noqa: UP028 -- the wrapper as users write it: `yield from` lets go of the pass differently
        yield x


def _broken(thr: at.Throttle, dev: FakeDevice | None, how: str, value: Callable[[int], float] = float) -> None:
    """Leave a pass over range(10) in step 2 in the way ``how``, deferring ``value(i)`` in each step."""
    view = thr.wrap(range(10))
    if how == "break":
        for i in view:
            thr.defer(value(i))
            if i == 2:
                break
    elif how == "generator":
        for i in _prefetched(view):
            thr.defer(value(i))
            if i == 2:
                break
    elif how == "islice":
        for i in itertools.islice(view, 3):
            thr.defer(value(i))
    elif how == "raise":
        with pytest.raises(KeyError):
            for i in view:
                thr.defer(value(i))
                if i == 2:
                    raise KeyError(i)
    elif how == "raise_in_generator":
        with pytest.raises(KeyError):
            for i in _prefetched(view):
                thr.defer(value(i))
                if i == 2:
                    raise KeyError(i)
    elif how == "except_as":
        try:
            for i in view:
                thr.defer(value(i))
                if i == 2:
                    raise KeyError(i)
        except KeyError as e:
            assert e.args == (2,)
    elif how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            for i in view:
                thr.defer(value(i))
                if i == 2:
                    raise KeyboardInterrupt
    elif how == "cycle":  # a pass kept alive by a reference cycle, finalized by the cyclic GC
        holder: dict[str, Any] = {}
        holder["self"] = holder
        holder["it"] = iter(view)
        for i in holder["it"]:
            thr.defer(value(i))
            if i == 2:
                break
        del holder
        gc.collect()


EXITS = ["break", "generator", "islice", "raise", "raise_in_generator", "except_as", "interrupt", "cycle"]


@pytest.mark.parametrize("how", EXITS)
def test_every_exit_records_the_step_it_leaves_with_its_values(how: str) -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    seen: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: seen.append((step, values["value"])))
    _broken(thr, dev, how)
    gc.collect()
    thr.drain()
    assert thr.stats.steps == 3 and dev.syncs == 0
    assert seen == [(0, 0.0), (1, 1.0), (2, 2.0)]
    for i in thr.wrap(range(2)):  # the next pass goes on from step 3
        thr.defer(10.0 + i)
    assert seen[3:] == [(3, 10.0), (4, 11.0)]


def test_a_nested_loop_over_the_same_throttle_is_an_error_not_a_truncation() -> None:
    thr = FakeDevice().throttle(2)
    view = thr.wrap(range(3))
    outer = []
    with pytest.raises(RuntimeError, match="ended by a new loop over the same Throttle"):
        for x in view:
            outer.append(x)
            for _ in view:
                pass
    assert outer == [0]


def test_zip_of_a_view_with_itself_is_an_error_not_one_pair() -> None:
    thr = FakeDevice().throttle(2)
    view = thr.wrap(range(5))
    with pytest.raises(RuntimeError, match="one Throttle serves one loop at a time"):
        list(zip(view, view, strict=False))


def test_an_iterator_kept_after_a_break_is_ended_quietly_by_the_next_loop() -> None:
    thr = FakeDevice().throttle(2)
    view = thr.wrap(range(5))
    kept = iter(view)
    for _ in kept:
        break
    assert list(view) == [0, 1, 2, 3, 4]  # a framework that never exhausts its iterator: the next epoch runs
    assert thr.stats.steps == 6


@pytest.mark.parametrize("source", [iter(range(3)), (x for x in range(3))], ids=["iterator", "generator"])
def test_a_view_of_an_unsized_source_is_truthy(source: Iterator[int]) -> None:
    view = at.throttle(source, device="cpu")
    assert bool(view) is True
    assert bool(at.throttle([], device="cpu")) is False  # a sized source answers for itself


def _nan_at_2(i: int) -> float:
    return math.nan if i == 2 else float(i)


def _in_step(thr: at.Throttle) -> None:
    thr.begin_step()
    thr.end_step()


def _from_thread(call: Callable[[], Any]) -> Any:
    """``call()`` in another thread, joined: what it returned or raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    return out[0]


# the calls that change the throttle after a loop: each raises the error its pass's end kept
NEXT_CALLS: dict[str, Callable[[at.Throttle], Any]] = {
    "a new pass": lambda thr: list(thr.wrap(range(2))),
    "begin_step()": _in_step,
    "step()": lambda thr: thr.step().__enter__() and thr.end_step(),
    "mark()": lambda thr: thr.mark(),
    "drain()": lambda thr: thr.drain(),
    "pause()": lambda thr: thr.pause(),
}


# every exit before the next pass, and every next call after a break
_CASES = [(how, "a new pass") for how in EXITS] + [("break", c) for c in NEXT_CALLS if c != "a new pass"]


@pytest.mark.parametrize(("how", "call"), _CASES)
def test_an_error_of_the_step_a_pass_leaves_on_the_cpu_is_raised_by_the_next_call(
    how: str, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synchronous step's delivery runs as the pass is let go, often in its finalizer (a break, the GC), which
    cannot raise: the throttle's next call that changes it raises the error, once."""
    ignored: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    thr = at.Throttle(2, device="cpu", nonfinite="raise")
    _broken(thr, None, how, _nan_at_2)
    gc.collect()
    assert ignored == []  # not printed as "Exception ignored in: <function Pass.__del__>"
    assert thr.stats.steps == 3 and thr.stats.nonfinite_first == 2
    with pytest.raises(at.NonFiniteError, match="step 2"):
        NEXT_CALLS[call](thr)
    NEXT_CALLS[call](thr)  # once: the call goes on now
    thr.drain()
    assert _from_thread(thr.drain) is None  # no claim left held


def test_the_kept_error_keeps_no_pass_nor_its_source_alive() -> None:
    thr = at.Throttle(2, device="cpu", nonfinite="raise")

    def batches() -> Iterator[int]:
        yield from range(10)

    source = batches()
    alive = weakref.ref(source)
    for i in thr.wrap(source):
        thr.defer(_nan_at_2(i), name="loss")
        if i == 2:
            break
    del source
    assert alive() is None  # freed at the break, not by the cyclic GC nor at the next call
    with pytest.raises(at.NonFiniteError):
        thr.drain()


def test_a_callbacks_error_at_a_break_is_raised_by_the_next_pass_with_the_callbacks_line() -> None:
    thr = at.Throttle(2, device="cpu")

    def log(step: int, values: dict[str, Any]) -> None:
        if step == 2:
            raise KeyError("the logger failed")

    thr.on_complete(log)
    _broken(thr, None, "break")
    with pytest.raises(KeyError, match="the logger failed") as caught:
        list(thr.wrap(range(2)))
    assert any(entry.name == "log" for entry in caught.traceback)  # where it was raised first
    assert list(thr.wrap(range(2))) == [0, 1]


def test_a_pass_superseded_while_its_step_raises_says_so_and_leaves_no_claim() -> None:
    thr = at.Throttle(2, device="cpu", nonfinite="raise")
    view = thr.wrap(range(5))
    first = iter(view)
    next(first)
    thr.defer(math.nan, name="loss")
    second = iter(view)
    with pytest.raises(at.NonFiniteError, match="step 0"):
        next(second)  # the new pass ended the first, whose step raised: here, once
    with pytest.raises(RuntimeError, match="ended by a new loop over the same Throttle"):
        next(first)
    assert _from_thread(thr.drain) is None  # no claim left held by the pass that did not start
    assert list(second) == [0, 1, 2, 3, 4] and thr.stats.steps == 6
