"""How a wrapped pass ends: the same outcome for the same kind of exit, wherever the frame let go of it."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

import asyncthrottle as at
from asyncthrottle.testing import FakeDevice


def _prefetched(view: Iterable[int]) -> Iterator[int]:
    """A plain generator wrapper, as users write them (prefetchers, samplers, progress helpers)."""
    for x in view:  # noqa: UP028 -- the wrapper as users write it: `yield from` lets go of the pass differently
        yield x


def _broken(thr: at.Throttle, dev: FakeDevice, how: str) -> None:
    view = thr.wrap(range(10))
    if how == "break":
        for i in view:
            thr.defer(float(i))
            if i == 2:
                break
    elif how == "generator":
        for i in _prefetched(view):
            thr.defer(float(i))
            if i == 2:
                break
    elif how == "islice":
        for i in itertools.islice(view, 3):
            thr.defer(float(i))
    elif how == "raise":
        with pytest.raises(KeyError):
            for i in view:
                thr.defer(float(i))
                if i == 2:
                    raise KeyError(i)
    elif how == "raise_in_generator":
        with pytest.raises(KeyError):
            for i in _prefetched(view):
                thr.defer(float(i))
                if i == 2:
                    raise KeyError(i)
    elif how == "except_as":
        try:
            for i in view:
                thr.defer(float(i))
                if i == 2:
                    raise KeyError(i)
        except KeyError as e:
            assert e.args == (2,)
    elif how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            for i in view:
                thr.defer(float(i))
                if i == 2:
                    raise KeyboardInterrupt
    elif how == "cycle":  # a pass kept alive by a reference cycle, finalized by the cyclic GC
        holder: dict[str, Any] = {}
        holder["self"] = holder
        holder["it"] = iter(view)
        for i in holder["it"]:
            thr.defer(float(i))
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
