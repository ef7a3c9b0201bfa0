"""Work that several tests read, done once a test session even where pytest-xdist spreads those tests
over its workers (a session-scoped fixture is made once a worker): the first to ask does it under a
file lock and saves what it made (pickled) in the session's temporary folder, which the workers share;
the others wait for the lock and read that."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")


def once(factory: pytest.TempPathFactory, key: Any, make: Callable[[Path], T]) -> T:
    """``make(folder)``'s result for ``key`` (any value with a stable ``repr``), made at the first
    call of the session into a folder of its own, which it may write its files in. A ``make`` that
    raises saves nothing: the next call makes it again, in an emptied folder."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # each worker's basetemp is a folder of the session's
    name = "once-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    saved = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if saved.exists():
            value: T = pickle.loads(saved.read_bytes())
            return value
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        value = make(folder)
        saved.write_bytes(pickle.dumps(value))
        return value
