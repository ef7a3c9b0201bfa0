"""The scripts under ``scripts/`` are programs that ``run`` runs, not test modules: they train (or
raise, or wait for torchrun's ranks) when imported, so ``--doctest-modules`` must not import them.
Runs that several tests read are made once a session (``shared_runs``)."""

from __future__ import annotations

import pytest
from _runs import SharedRuns

collect_ignore = ["scripts"]


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    """The session's runs that several tests read (:class:`SharedRuns`)."""
    return SharedRuns(tmp_path_factory)
