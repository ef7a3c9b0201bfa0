"""A library's schedule in fastai's shape (``fastai.callback.schedule.combine_scheds``): its tensor
built by the library's own helper around ``torch.tensor`` (as ``fastai.torch_core.tensor``),
summed into a new tensor (no mark) and read every step by a closure. The audit judges the
closure's free variable by how the enclosing function computed it: from Python floats, no read
counts; moved to the device, or computed from a module's parameter, every read counts."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from asyncthrottle.audit.patches import Patches  # noqa: E402
from asyncthrottle.audit.syncsites import SyncSites  # noqa: E402

# the library: its tensor helper, and a schedule whose tensor is built by the line PCTS
LIBRARY = '''
import numbers

import torch

DEVICE = torch.device("cpu")  # the library's default device: "cuda" on a GPU


def tensor(x, *rest, **kwargs):
    "Like torch.as_tensor, but lists too, and several elements passed directly."
    if len(rest):
        x = (x,) + rest
    res = (x if isinstance(x, torch.Tensor)
           else torch.tensor(x, **kwargs) if isinstance(x, (tuple, list, numbers.Number))
           else torch.as_tensor(x, **kwargs))
    return res.float() if res.dtype is torch.float64 else res


def combine_scheds(pcts, scheds, weight=None):
    "Combine scheds according to pcts in one function."
    assert sum(pcts) == 1.0
    PCTS
    assert torch.all(pcts >= 0)
    pcts = torch.cumsum(pcts, 0)
    pct_lim = len(pcts) - 2

    def _inner(pos):
        idx = min((pos >= pcts).nonzero().max(), pct_lim)
        actual_pos = (pos - pcts[idx]) / (pcts[idx + 1] - pcts[idx])
        return scheds[idx](actual_pos.item())

    return _inner
'''
# the line that builds the schedule's tensor: from Python floats; moved to the device; computed
# from a module's parameter (no autograd history: detached)
HOST = "pcts = tensor([0] + list(pcts))"
MOVED = "pcts = tensor([0] + list(pcts)).to(DEVICE)"
FROM_PARAMETER = "pcts = tensor([0] + list(pcts)) * weight.detach()[0, 0]"
# the reads of the closure, every call: min()'s comparison, nonzero, scheds[idx], item
INNER = {"Tensor.__bool__", "Tensor.nonzero", "Tensor.__index__", "Tensor.item"}


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[SyncSites]:
    """The audit of the library's files (in ``tmp_path``), torch patched until the test ends."""
    audit, patches = SyncSites([str(tmp_path)]), Patches()
    with contextlib.ExitStack() as undo:
        undo.callback(patches.undo)
        undo.callback(audit.stop)
        audit.start(patches)
        yield audit


def library(tmp_path: Path, pcts: str) -> ModuleType:
    """The library, its PCTS line written as ``pcts``, imported from a file of ``tmp_path``."""
    name = f"fakelib_{abs(hash(pcts))}"
    path = tmp_path / f"{name}.py"
    path.write_text(LIBRARY.replace("PCTS", pcts))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(name, None)
    return module


def lines(lib: ModuleType, text: str) -> int:
    """The line of the library's source that holds ``text``."""
    source = Path(lib.__file__ or "").read_text().splitlines()
    return next(k for k, line in enumerate(source, 1) if text in line)


def run_schedule(lib: ModuleType, **kwargs: Any) -> list[float]:
    """The library's one-cycle schedule (two cosine halves) at 8 points of training."""
    cos = lambda start, end: lambda pos: start + (end - start) * pos  # noqa: E731
    at = lib.combine_scheds([0.25, 0.75], [cos(0.1, 1.0), cos(1.0, 0.0)], **kwargs)
    return [at(k / 8) for k in range(8)]


def test_a_schedule_a_library_helper_builds_from_floats_counts_no_read(
    sites: SyncSites, tmp_path: Path,
) -> None:
    lib = library(tmp_path, HOST)
    sites.in_step = True
    values = run_schedule(lib)
    assert values[0] == pytest.approx(0.1) and values[4] == pytest.approx(2 / 3)
    # the helper's torch.tensor made it on the host; what is computed from it stays there
    assert sites.rows(1) == []
    # the same tensor read at the script's own line is no device value either
    assert lib.tensor(0.5, 0.25).sum().item() == 0.75
    assert sites.rows(1) == []


@pytest.mark.parametrize("pcts", [MOVED, FROM_PARAMETER], ids=["moved", "from_parameter"])
def test_the_same_schedule_on_the_device_counts_each_read(
    sites: SyncSites, tmp_path: Path, pcts: str,
) -> None:
    lib = library(tmp_path, pcts)
    weight = torch.nn.Linear(1, 1).weight  # a module's parameter: on the device
    with torch.no_grad():
        weight.fill_(1.0)
    sites.in_step = True
    values = run_schedule(lib, weight=weight)
    assert values[0] == pytest.approx(0.1) and values[4] == pytest.approx(2 / 3)
    rows = [(row["site"], row["call"], row["count"]) for row in sites.rows(1)]
    name = Path(lib.__file__ or "").name
    inner = {(line, call): count for site, call, count in rows
             for line in [int(site.rpartition(":")[2])] if site.startswith(name)}
    first, last = lines(lib, "idx = min("), lines(lib, "return scheds[idx]")
    # every call of the closure reads: its branch, nonzero, the index and the item
    assert {call for (line, call) in inner if first <= line <= last} == INNER
    assert all(count >= 8 for (line, _), count in inner.items() if first <= line <= last)
    # and the enclosing function's own check of the tensor it just moved or computed
    assert inner[(lines(lib, "assert torch.all"), "Tensor.__bool__")] == 1


def test_a_library_s_as_tensor_of_a_buffer_leaves_it_on_the_device(sites: SyncSites) -> None:
    norm = torch.nn.BatchNorm1d(3)
    counter = norm.num_batches_tracked
    assert torch.as_tensor(counter) is counter  # the same tensor, as a helper hands it back
    read = lambda: counter.item()  # noqa: E731
    read()
    assert [(row["call"], row["count"]) for row in sites.rows(1)] == [("Tensor.item", 1)]
    built = torch.as_tensor([1.0, 2.0])  # from Python floats: the host's
    assert built.sum().item() == 3.0
    assert len(sites.rows(1)) == 1
