"""The report's ``loader``, in process, from real torch DataLoaders: what the script wrote
(``pin_memory=True`` stays True where torch turns it off), what torch runs with, and the batch size
where a framework batches over a DataLoader made with ``batch_size=None`` (fastai's shape, faked
here: no fastai import); then through the runner's hooks, as a loop meets them."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from asyncthrottle.audit.patches import Patches
from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run import torchhooks
from asyncthrottle.run.loaders import describe, said
from asyncthrottle.run.steps import Steps

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402
from torch.utils.data.dataloader import (  # noqa: E402
    _DatasetKind,
    _SingleProcessDataLoaderIter,
)

# torch pins only where an accelerator is available (this machine: none; a GPU machine: one)
PINS = torch.accelerator.is_available()
OFF = None if PINS else "no accelerator"


def _data(n: int = 12) -> Any:
    return TensorDataset(torch.arange(n * 2, dtype=torch.float32).view(n, 2), torch.zeros(n, 1))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without torch's warning for pin_memory=True without an accelerator, which these loaders
    expect."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
        yield


@pytest.mark.parametrize(("pin_memory", "effect", "off"), [(True, PINS, OFF), (False, False, None)])
def test_pin_memory_is_what_the_script_wrote_with_what_torch_runs_beside_it(
        pin_memory: bool, effect: bool, off: str | None) -> None:
    loader = DataLoader(_data(), batch_size=4, pin_memory=pin_memory)
    with _quiet():
        iterator = iter(loader)
    assert iterator._pin_memory is effect  # torch's own: loader.pin_memory and an accelerator
    assert describe(iterator, loader) == {
        "num_workers": 0, "pin_memory": pin_memory, "pin_memory_in_effect": effect,
        "pin_memory_off": off, "batch_size": 4, "batched_by": None}
    # without the DataLoader (an iterator the runner did not see made), only what is in effect
    assert describe(iterator)["pin_memory"] is None
    assert said(describe(iterator)) == f"DataLoader(num_workers=0, pin_memory={effect} (in effect), " \
                                       "batch_size=4)"


def test_a_batch_sampler_s_size_is_the_batch_size_and_batch_size_none_has_none() -> None:
    sampler = torch.utils.data.BatchSampler(range(12), batch_size=3, drop_last=False)
    loader = DataLoader(_data(), batch_sampler=sampler)
    assert loader.batch_size is None  # torch's: a batch_sampler= leaves batch_size None
    assert describe(iter(loader), loader)["batch_size"] == 3
    unbatched = DataLoader(_data(), batch_size=None)
    assert describe(iter(unbatched), unbatched)["batch_size"] is None


class _Batches(IterableDataset):  # type: ignore[misc]
    """A dataset that yields whole batches (``batch_size`` its own): the DataLoader over it is
    made with ``batch_size=None``."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, 12, self.batch_size):
            yield torch.full((self.batch_size, 2), float(start)), torch.zeros(self.batch_size, 1)


class _FrameworkLoader:
    """fastai's ``DataLoader`` faked: it batches (``bs``), and ``bs`` is its attribute; a
    ``batch_size`` property of its class is no instance attribute (and never read)."""

    def __init__(self, bs: int, pin_memory: bool) -> None:
        self.bs = bs
        self.fake = _OwnDataset(self, pin_memory)

    @property
    def batch_size(self) -> int:
        raise AssertionError("a property of the script's is never run")

    def batches(self) -> Iterator[Any]:
        for start in range(0, 12, self.bs):
            yield torch.full((self.bs, 2), float(start)), torch.zeros(self.bs, 1)

    def __iter__(self) -> Iterator[Any]:
        # as fastai: torch's iterator made straight from the loader that is its own dataset
        yield from _SingleProcessDataLoaderIter(self.fake)


class _OwnDataset:
    """fastai's ``_FakeLoader`` faked: what torch's iterator reads of a DataLoader, its own
    dataset, with no batching of torch's (``_auto_collation`` False, an endless index sampler),
    holding the loader that batches (``d``)."""

    _IterableDataset_len_called = None
    _auto_collation = drop_last = persistent_workers = False
    _dataset_kind = _DatasetKind.Iterable
    generator = None
    timeout = num_workers = 0
    pin_memory_device = ""
    in_order = True

    def __init__(self, d: _FrameworkLoader, pin_memory: bool) -> None:
        self.dataset, self.d, self.pin_memory = self, d, pin_memory
        self._index_sampler = iter(int, 1)

    def collate_fn(self, batch: Any) -> Any:
        return batch

    def __iter__(self) -> Iterator[Any]:
        return self.d.batches()


def test_a_framework_that_batches_over_batch_size_none_gives_its_batch_size() -> None:
    # a dataset that batches, under a torch DataLoader
    loader = DataLoader(_Batches(3), batch_size=None)
    assert describe(iter(loader), loader)["batch_size"] == 3
    assert describe(iter(loader), loader)["batched_by"] == f"{__name__}._Batches"
    # fastai's shape: torch's iterator made from the framework's own loader object
    framework = _FrameworkLoader(4, pin_memory=True)
    with _quiet():
        iterator = _SingleProcessDataLoaderIter(framework.fake)
    found = describe(iterator)
    assert found == {"num_workers": 0, "pin_memory": True, "pin_memory_in_effect": PINS,
                     "pin_memory_off": OFF, "batch_size": 4,
                     "batched_by": f"{__name__}._FrameworkLoader"}
    assert said(found).endswith(f"batch_size=4 (batched by {__name__.partition('.')[0]}'s "
                                "_FrameworkLoader))")


def _train(batches: Any) -> Steps:
    """A loop over ``batches`` under the runner's torch hooks; its Steps."""
    steps = Steps(lambda device: ThrottleHooks(None, device=device, trace=0, nonfinite=None))
    patches = Patches()
    torchhooks.install(steps, patches)
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with _quiet():
            for x, y in batches:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    finally:
        steps.finish()
        patches.undo()
    return steps


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_hooks_describe_the_loop_s_dataloader_as_the_script_wrote_it(num_workers: int) -> None:
    # (num_workers=2: torch's worker processes, the loader's own; forked, a second or less)
    steps = _train(DataLoader(_data(), batch_size=4, pin_memory=True, num_workers=num_workers))
    assert steps.runner is not None and steps.runner.steps == 3
    assert steps.loader == {"num_workers": num_workers, "pin_memory": True,
                            "pin_memory_in_effect": PINS, "pin_memory_off": OFF,
                            "batch_size": 4, "batched_by": None}


def test_the_hooks_find_a_framework_s_batch_size_through_its_own_loader() -> None:
    steps = _train(_FrameworkLoader(6, pin_memory=False))
    assert steps.runner is not None and steps.runner.steps == 2
    assert steps.loader is not None
    assert (steps.loader["batch_size"], steps.loader["pin_memory"]) == (6, False)
    assert steps.loader["batched_by"] == f"{__name__}._FrameworkLoader"
