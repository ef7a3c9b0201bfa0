"""Deferred: a value settled once, whichever thread reads it first."""

from __future__ import annotations

from typing import Any

import pytest

import asyncthrottle._deferred as deferred_module
from asyncthrottle.testing import FakeDevice


class _Lock:
    """The settling lock, seen: whether it is held, and what happens as it is taken."""

    def __init__(self, on_enter: Any = None) -> None:
        self.held, self.on_enter = False, on_enter

    def __enter__(self) -> None:
        self.held = True
        if self.on_enter is not None:
            self.on_enter()

    def __exit__(self, *exc: object) -> None:
        self.held = False


def _deferred_value() -> Any:
    dev = FakeDevice()
    thr = dev.throttle(2)
    thr.begin_step()
    dev.launch(0.010)
    value = thr.defer([1.0, 2.0], name="x")
    thr.end_step()
    return value


def test_a_value_is_made_on_the_host_under_the_settling_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    lock = _Lock()
    monkeypatch.setattr(deferred_module, "_SETTLING", lock)
    walk = deferred_module.map_leaves
    seen = []

    def map_leaves(*args: Any) -> Any:
        seen.append(lock.held)
        return walk(*args)

    monkeypatch.setattr(deferred_module, "map_leaves", map_leaves)
    value = _deferred_value()
    assert value.get() == [1.0, 2.0]
    assert seen == [True] and not lock.held


def test_a_value_another_thread_made_while_this_one_waited_is_not_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop's delivery and a logging thread's get() at once: the second to take the lock finds
    the value made (a second copy could read a ring slot the delivery let go, and overwrite it)."""
    value = _deferred_value()
    theirs = [1.0, 2.0]

    def the_other_thread_settles() -> None:
        value._host, value._settled = theirs, True

    monkeypatch.setattr(deferred_module, "_SETTLING", _Lock(the_other_thread_settles))
    made = []
    monkeypatch.setattr(deferred_module, "map_leaves", lambda *args: made.append(args))
    assert value.get() is theirs and made == []
