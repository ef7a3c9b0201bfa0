"""The sync sites by line: each host read of a tensor counted at the script's line, with its call
name, in steps and outside them; CUDA's sync warnings on CUDA; nothing left patched."""

from __future__ import annotations

import collections
import contextlib
import inspect
import io
import os
import pickle
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from _runs import start, under_run  # noqa: E402

import asyncthrottle as at  # noqa: E402
from asyncthrottle.audit.patches import Patches  # noqa: E402
from asyncthrottle.audit.syncsites import CUDA_SYNC, SyncSites  # noqa: E402
from asyncthrottle.parts.syncaudit import SYNC_MESSAGE  # noqa: E402

HERE = Path(__file__).resolve().parent
NAME = Path(__file__).name
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
PACKAGE_DIR = os.path.dirname(os.path.abspath(at.__file__))


@pytest.fixture
def sites() -> Iterator[SyncSites]:
    with counting(SyncSites([str(HERE)])) as audit:
        yield audit


@contextlib.contextmanager
def counting(audit: SyncSites) -> Iterator[SyncSites]:
    patches = Patches()
    try:
        audit.start(patches)
        yield audit
    finally:
        audit.stop()
        patches.undo()


def site(func: Callable[..., Any]) -> str:
    """The site of a one-line lambda: this file and its line."""
    return f"{NAME}:{func.__code__.co_firstlineno}"


def counted(audit: SyncSites, steps: int = 1) -> list[tuple[str, str, int, bool]]:
    return [(r["site"], r["call"], r["count"], r["in_step"]) for r in audit.rows(steps)]


X = torch.arange(6.0)
MASK = X > 2

READS: list[tuple[Callable[[], Any], str]] = [
    (lambda: X.sum().item(), "Tensor.item"),
    (lambda: bool(X.sum()), "Tensor.__bool__"),
    (lambda: 1 if X.sum() else 0, "Tensor.__bool__"),
    (lambda: float(X.sum()), "Tensor.__float__"),
    (lambda: int(X.sum()), "Tensor.__int__"),
    (lambda: [0, 1, 2][X.long()[1]], "Tensor.__index__"),
    (lambda: X.tolist(), "Tensor.tolist"),
    (lambda: X.numpy(), "Tensor.numpy"),
    (lambda: np.asarray(X), "Tensor.__array__"),
    (lambda: X.cpu(), "Tensor.cpu"),
    (lambda: X.cpu().numpy(), "Tensor.cpu"),  # one read, not two
    (lambda: repr(X), "Tensor.__repr__"),
    (lambda: str(X), "Tensor.__str__"),
    (lambda: print(X, file=io.StringIO()), "Tensor.__str__"),
    (lambda: f"{X.sum():.2f}", "Tensor.__format__"),
    (lambda: X.nonzero(), "Tensor.nonzero"),
    (lambda: torch.nonzero(X), "torch.nonzero"),
    (lambda: X.argwhere(), "Tensor.argwhere"),
    (lambda: X.masked_select(MASK), "Tensor.masked_select"),
    (lambda: torch.masked_select(X, MASK), "torch.masked_select"),
    (lambda: X.unique(), "Tensor.unique"),
    (lambda: torch.unique(X), "torch.unique"),
    (lambda: X[MASK], "Tensor.__getitem__"),
    (lambda: X[MASK.to(torch.uint8)], "Tensor.__getitem__"),
    (lambda: X.equal(X), "Tensor.equal"),
    (lambda: torch.equal(X, X), "torch.equal"),
    (lambda: X.allclose(X), "Tensor.allclose"),
    (lambda: torch.allclose(X, X), "torch.allclose"),
    (lambda: torch.where(MASK), "torch.where"),
    (lambda: 2.0 in X, "Tensor.__contains__"),
]


# indexing by a uint8 mask warns (deprecated), at the lambda's line as without the audit
@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")
@pytest.mark.parametrize(("read", "call"), READS, ids=[f"{call}@{i}" for i, (_, call) in enumerate(READS)])
def test_each_read_is_counted_once_at_its_line_with_its_call(
    sites: SyncSites, read: Callable[[], Any], call: str
) -> None:
    sites.in_step = True
    read()
    read()
    assert counted(sites) == [(site(read), call, 2, True)]


NOT_READS: list[Callable[[], Any]] = [
    lambda: (X + 1) * 2,
    lambda: torch.relu(X).sum(),
    lambda: X[0],
    lambda: X[1:3],
    lambda: X[:, None][0],
    lambda: X.to(torch.float64),
    lambda: X.to("cpu"),  # a CPU run's x.to(device): the host-to-device copy, no read
    lambda: X.long(),
    lambda: torch.where(MASK, X, 0.0),  # the three-argument where selects on the device
]


@pytest.mark.parametrize("op", NOT_READS, ids=[str(i) for i in range(len(NOT_READS))])
def test_ops_that_are_not_reads_are_not_counted(sites: SyncSites, op: Callable[[], Any]) -> None:
    op()
    assert counted(sites) == []


class OnDevice(torch.Tensor):
    """A tensor that says it is on a device (it is on the CPU): its ``to("cpu")`` is a read."""

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():  # results are plain (host) tensors
            out = func(*args, **kwargs)
            moved = "device" in kwargs or any(
                isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])
            # to(dtype) stays on the device
            return out.as_subclass(OnDevice) if func.__name__ == "to" and not moved else out


def test_to_the_host_from_a_device_tensor_is_a_read_unless_non_blocking(sites: SyncSites) -> None:
    device = torch.Tensor._make_subclass(OnDevice, torch.ones(3))
    # copy=True: a real device tensor's to("cpu") is never the no-op that returns it
    copy = lambda: device.to("cpu", copy=True)  # noqa: E731
    copy_as = lambda: device.to(torch.device("cpu"), torch.float64)  # noqa: E731
    like = lambda: device.to(torch.ones(1, dtype=torch.int64))  # noqa: E731
    copy(), copy_as(), like()
    device.to("cpu", non_blocking=True, copy=True)
    device.to("cpu", torch.float64, True)  # non_blocking, positional
    device.to(torch.float64)  # stays on the device
    assert sorted(counted(sites)) == sorted(
        [(site(copy), "Tensor.to", 1, False), (site(copy_as), "Tensor.to", 1, False),
         (site(like), "Tensor.to", 1, False)])
    assert all(row["blocked_s"] is not None for row in sites.rows(1))  # each copy timed


def test_reads_in_steps_and_outside_are_two_rows_and_per_step_divides_by_steps(sites: SyncSites) -> None:
    read = lambda: X.sum().item()  # noqa: E731
    other = lambda: X.tolist()  # noqa: E731
    for _ in range(4):
        sites.in_step = True
        read()
        read()
        other()
        sites.in_step = False
    read()  # an evaluation, a checkpoint
    rows = sites.rows(4)
    assert [(r["site"], r["call"], r["count"], r["per_step"], r["in_step"]) for r in rows] == [
        (site(read), "Tensor.item", 8, 2.0, True),
        (site(other), "Tensor.tolist", 4, 1.0, True),
        (site(read), "Tensor.item", 1, 0.25, False),
    ]
    assert [r["per_step"] for r in sites.rows(0)] == [0.0, 0.0, 0.0]  # no steps: no division


def test_tail_rows_are_the_in_step_reads_after_the_mark(sites: SyncSites) -> None:
    read = lambda: X.sum().item()  # noqa: E731
    other = lambda: X.tolist()  # noqa: E731
    assert sites.tail_rows() == []
    sites.in_step = True
    read()
    other()
    sites.mark_tail()
    read()
    read()  # the tail of the last step: two more reads at one site, none at the other
    sites.in_step = False
    read()  # outside steps: never in the tail
    assert [(r["site"], r["call"], r["count"], r["in_step"]) for r in sites.tail_rows()] == [
        (site(read), "Tensor.item", 2, True)]
    assert counted(sites) == [(site(read), "Tensor.item", 3, True),
                              (site(read), "Tensor.item", 1, False),
                              (site(other), "Tensor.tolist", 1, True)]
    sites.in_step = True  # a new step: no mark in it yet
    assert sites.tail_rows() == []


@pytest.mark.parametrize("closed", [False, True])
def test_a_discarded_step_s_reads_are_outside_steps(sites: SyncSites, closed: bool) -> None:
    read = lambda: X.sum().item()  # noqa: E731
    sites.in_step = True
    read()
    sites.in_step = False
    sites.in_step = True  # opened provisionally (the loader handed a batch)...
    read()
    read()
    if closed:
        sites.in_step = False
    sites.discard_step()  # ...and it trained nothing
    sites.in_step = False
    assert counted(sites) == [(site(read), "Tensor.item", 2, False),
                              (site(read), "Tensor.item", 1, True)]


def test_rows_carry_the_absolute_path_of_the_site_s_file(sites: SyncSites) -> None:
    X.sum().item()
    assert [row["file"] for row in sites.rows(1)] == [__file__]


def test_a_read_inside_repr_or_format_is_counted_once(sites: SyncSites) -> None:
    scalar = X.sum()
    show = lambda: (repr(scalar), f"{scalar:.3f}", repr(X.reshape(2, 3)))  # noqa: E731
    show()  # torch's repr and format call item() and tolist() inside
    assert sorted(counted(sites)) == [(site(show), "Tensor.__format__", 1, False),
                                      (site(show), "Tensor.__repr__", 2, False)]


def test_an_f_string_s_row_says_which_of_its_fields_formatted_a_tensor(sites: SyncSites) -> None:
    scalar, step = X.sum(), 3
    log = lambda: f"step {step} of {step} loss {scalar:.3f} {scalar}"  # noqa: E731
    log()
    log()
    (row,) = sites.rows(1)
    # the third and fourth fields of the line; the ints are no reads
    assert (row["call"], row["count"], row["fields"]) == ("Tensor.__format__", 4, [2, 3])
    format(scalar, ".2f")  # no f-string: no field
    assert [r.get("fields") for r in sites.rows(1) if r["site"] != row["site"]] == [None]


def _code_in(folder: str, source: str) -> dict[str, Any]:
    """Functions whose frames are files of ``folder`` (torch's, this library's)."""
    scope: dict[str, Any] = {}
    exec(compile(source, os.path.join(folder, "_syncsites_test_fake.py"), "exec"), scope)
    return scope


def test_reads_made_by_torch_or_this_library_are_theirs_not_the_scripts(sites: SyncSites) -> None:
    inside_torch = _code_in(TORCH_DIR, "def step(x):\n    return x.sum().item()\n")["step"]
    inside_ours = _code_in(PACKAGE_DIR, "def deliver(x):\n    return x.tolist()\n")["deliver"]
    call_torch = lambda: inside_torch(X)  # noqa: E731
    call_ours = lambda: inside_ours(X)  # noqa: E731
    call_torch(), call_ours()
    # on the CPU, torch's own reads live on the host on any device (an optimizer's step counter)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))])
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()
    assert counted(sites) == []


def test_a_script_callback_called_by_torch_is_the_scripts(sites: SyncSites) -> None:
    inside_torch = _code_in(TORCH_DIR, "def run(hook, x):\n    return hook(x)\n")["run"]
    hook = lambda x: x.sum().item()  # noqa: E731
    inside_torch(hook, X)
    assert counted(sites) == [(site(hook), "Tensor.item", 1, False)]


# an installed framework: its read (line 2), a call through it, its call of the script's code, and
# its own thread's loop (that starts the audit there)
FAKEFW = """\
def read(x):
    return x.sum().item()


def through(x):
    return read(x)


def calls(hook, x):
    return hook(x)


def main(start, x):
    start()
    return read(x)
"""


def _module(path: Path, source: str) -> dict[str, Any]:
    """The functions of ``source``, written to ``path`` and run as that file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    scope: dict[str, Any] = {}
    exec(compile(source, str(path), "exec"), scope)
    return scope


@pytest.fixture
def fakefw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``fakefw``, installed: ``tmp_path/site-packages/fakefw``, that folder on ``sys.path``."""
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    return _module(tmp_path / "site-packages" / "fakefw" / "__init__.py", FAKEFW)


def with_via(audit: SyncSites) -> list[tuple[str, str, int, str | None]]:
    return by_site([(r["site"], r["call"], r["count"], r["via"]) for r in audit.rows(1)])


def by_site(rows: list[tuple[str, str, int, str | None]]) -> list[tuple[str, str, int, str | None]]:
    return sorted(rows, key=lambda row: (row[0], row[3] or ""))


def test_a_read_inside_an_installed_package_counts_at_the_script_line_that_called_it(
        sites: SyncSites, fakefw: dict[str, Any]) -> None:
    call = lambda: fakefw["read"](X)  # noqa: E731
    deep = lambda: fakefw["through"](X)  # noqa: E731
    hook = lambda x: x.sum().item()  # noqa: E731
    back = lambda: fakefw["calls"](hook, X)  # noqa: E731
    call(), deep(), back()
    assert with_via(sites) == by_site([
        (site(call), "Tensor.item", 1, "fakefw/__init__.py:2"),
        (site(deep), "Tensor.item", 1, "fakefw/__init__.py:2"),  # via: the innermost frame
        (site(hook), "Tensor.item", 1, None),  # the script's code the package called: its own
    ])


def test_a_line_s_own_read_and_its_read_via_a_package_are_two_rows(
        sites: SyncSites, fakefw: dict[str, Any]) -> None:
    both = lambda: (X.sum().item(), fakefw["read"](X))  # noqa: E731
    both()
    both()
    assert with_via(sites) == [(site(both), "Tensor.item", 2, None),
                               (site(both), "Tensor.item", 2, "fakefw/__init__.py:2")]


def test_a_package_read_with_no_script_frame_outside_is_the_package_s_line(
        fakefw: dict[str, Any]) -> None:
    audit = SyncSites([str(HERE)])
    # the package's own thread, whose reads the audit counts: nothing of the script's is outside
    patches = Patches()
    worker = threading.Thread(target=fakefw["main"], args=(lambda: audit.start(patches), X))
    try:
        worker.start()
        worker.join()
    finally:
        audit.stop()
        patches.undo()
    assert with_via(audit) == [("fakefw/__init__.py:2", "Tensor.item", 1, None)]
    ours = _code_in(PACKAGE_DIR, "def deliver(read, x):\n    return read(x)\n")["deliver"]
    with counting(SyncSites([str(HERE)])) as made_for_us:
        ours(fakefw["read"], X)  # a package this library called (as an on_complete): the library's
    assert with_via(made_for_us) == []


def test_a_package_in_the_script_s_venv_is_installed_and_an_installed_script_is_the_script_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    monkeypatch.syspath_prepend(str(venv))
    framework = _module(venv / "fw" / "core.py", FAKEFW)["read"]
    script = _module(tmp_path / "train.py", "def step(fw, x):\n    return fw(x)\n")["step"]
    with counting(SyncSites([str(tmp_path)])) as project:
        script(framework, X)
    # a script run from site-packages (run -m pkg.train): its package's files are its own
    mine = venv / "pkg"
    model = _module(mine / "model.py", FAKEFW)["read"]
    train = _module(mine / "train.py", "def step(fw, x):\n    return fw(x)\n")["step"]
    with counting(SyncSites([str(mine)])) as installed:
        train(model, X), train(framework, X)
    assert with_via(project) == [("train.py:2", "Tensor.item", 1, "fw/core.py:2")]
    assert with_via(installed) == [("model.py:2", "Tensor.item", 1, None),
                                   ("train.py:2", "Tensor.item", 1, "fw/core.py:2")]


def test_a_throttles_deferred_values_are_not_the_scripts_reads(sites: SyncSites) -> None:
    thr = at.Throttle(2)
    seen: list[float] = []
    thr.on_complete(lambda step, values: seen.append(float(values["loss"])))  # a host copy
    for _ in thr.wrap(range(3)):
        sites.in_step = True
        thr.defer(X.sum(), "loss")
        sites.in_step = False
    assert counted(sites) == []  # the library read them, after their step: no site is its own
    assert seen == [15.0, 15.0, 15.0]


def test_a_read_on_another_thread_is_not_counted(sites: SyncSites) -> None:
    worker = threading.Thread(target=lambda: X.cpu().tolist())
    worker.start()
    worker.join()
    assert counted(sites) == []


def test_sites_outside_the_roots_are_named_from_their_sys_path_entry(tmp_path: Path) -> None:
    with counting(SyncSites([str(tmp_path)])) as audit:
        read = lambda: X.sum().item()  # noqa: E731
        read()
    assert counted(audit)[0][0] in (f"run/{NAME}:{read.__code__.co_firstlineno}", site(read))


def test_roots_must_be_a_list_of_paths() -> None:
    with pytest.raises(TypeError, match=r"roots must be a list of folder paths \(str\), got 'train'"):
        SyncSites("train")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="roots must be a list"):
        SyncSites([3])  # type: ignore[list-item]


# what torch.Tensor's class dict gains from others while tests run: copyreg caches the slots of a
# class the first time one of its instances is pickled or copied (another test's deepcopy)
_CACHES = {"__slotnames__"}


def _patched_state() -> tuple[dict[str, Any], dict[str, Any], Any, list[Any]]:
    tensor = {name: value for name, value in vars(torch.Tensor).items() if name not in _CACHES}
    module = {name: getattr(torch, name) for name in (
        "nonzero", "argwhere", "masked_select", "unique", "equal", "allclose", "where")}
    return tensor, module, warnings.showwarning, list(warnings.filters)


PRISTINE = _patched_state()  # at import, before any test started an audit


def test_undo_restores_every_method_and_start_twice_counts_once() -> None:
    before = (*PRISTINE[:2], warnings.showwarning, list(warnings.filters))
    audit, patches = SyncSites([str(HERE)]), Patches()
    audit.start(patches)
    audit.start(patches)  # idempotent: one wrapper, one count
    assert inspect.getattr_static(torch.Tensor, "item") is not before[0].get("item")
    read = lambda: X.sum().item()  # noqa: E731
    with pytest.raises(ZeroDivisionError):
        try:
            read()
            1 / 0  # noqa: B018
        finally:
            audit.stop()
            patches.undo()
    audit.stop()
    assert counted(audit) == [(site(read), "Tensor.item", 1, False)]
    after = _patched_state()
    assert after[0].keys() == before[0].keys() and all(after[0][k] is v for k, v in before[0].items())
    assert after[1] == before[1] and after[2] is before[2] and after[3] == before[3]
    X.sum().item()
    assert len(audit.rows(1)) == 1  # nothing counts once stopped


def test_a_start_that_fails_leaves_nothing_patched_once_undone() -> None:
    class Broken(FakeCuda):
        def _lazy_call(self, call: Callable[[], None]) -> None:
            raise RuntimeError("no driver")

    patches = Patches()
    with pytest.raises(RuntimeError, match="no driver"):
        SyncSites([str(HERE)], cuda=Broken()).start(patches)
    patches.undo()
    after = _patched_state()
    assert all(after[0][k] is v for k, v in PRISTINE[0].items()) and after[0].keys() == PRISTINE[0].keys()
    assert after[1] == PRISTINE[1]


def test_start_initialises_no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden() -> bool:
        raise AssertionError("start() asked torch.cuda.is_available()")

    monkeypatch.setattr(torch.cuda, "is_available", forbidden)
    monkeypatch.setattr(torch.cuda, "_lazy_init", forbidden)
    with counting(SyncSites([str(HERE)])):
        assert not torch.cuda.is_initialized()


# -- CUDA: its sync debug mode's warnings decide --------------------------------------------------


class FakeCuda:
    """torch.cuda's lazy init and sync debug mode: CUDA 'initialises' when the test says."""

    def __init__(self) -> None:
        self.mode: Any = 0
        self._queued_calls: list[tuple[Callable[[], None], list[str]]] = []

    def get_sync_debug_mode(self) -> Any:
        return self.mode

    def set_sync_debug_mode(self, mode: Any) -> None:
        self.mode = mode

    def _lazy_call(self, call: Callable[[], None]) -> None:
        self._queued_calls.append((call, []))

    def initialise(self) -> None:
        for call, _ in self._queued_calls:
            call()


# a tensor whose item() and tolist() warn as torch's sync debug mode does on a synchronizing op
# (from torch's own files, as CUDA's warnings come from torch)
SYNCING = f"""\
import warnings
import torch


class Syncing(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("item", "tolist", "__float__"):
            warnings.warn({SYNC_MESSAGE!r}, UserWarning, stacklevel=2)
        return super().__torch_function__(func, types, args, kwargs or {{}})
"""
Syncing = _code_in(TORCH_DIR, SYNCING)["Syncing"]


@pytest.fixture
def cuda() -> FakeCuda:
    return FakeCuda()


def test_on_cuda_a_read_counts_when_it_synced_and_a_sync_outside_reads_is_named_cuda_sync(
    cuda: FakeCuda,
) -> None:
    hook, filters = warnings.showwarning, list(warnings.filters)
    audit, patches = SyncSites([str(HERE)], cuda=cuda), Patches()
    audit.start(patches)
    audit.start(patches)  # one hook, one queued call
    try:
        before_init = lambda: X.sum().item()  # noqa: E731
        before_init()  # CUDA not started yet: a read counts as it would sync
        assert cuda.mode == 0
        cuda.initialise()
        assert cuda.mode == "warn"
        synced = torch.Tensor._make_subclass(Syncing, torch.ones(2))
        audit.in_step = True
        read = lambda: synced.sum().item()  # noqa: E731
        host_only = lambda: X.sum().item()  # noqa: E731
        bare = lambda: warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # noqa: E731
        in_torch = _code_in(TORCH_DIR, "def norm(x):\n    return x.tolist()\n")["norm"]
        through_torch = lambda: in_torch(synced)  # noqa: E731
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("ignore")  # the script's own filter hides no sync from the audit
            for _ in range(2):
                read(), host_only(), bare(), through_torch()
        assert shown == []  # counted, never shown: the report lists them
    finally:
        audit.stop()
        patches.undo()
    assert sorted(counted(audit, 2)) == sorted([
        (site(before_init), "Tensor.item", 1, False),
        (site(read), "Tensor.item", 2, True),  # one read that synced: counted once, named
        (site(bare), CUDA_SYNC, 2, True),
        (site(through_torch), "Tensor.tolist", 2, True),  # torch's own read, at the script's line
    ])
    assert cuda.mode == 0 and warnings.showwarning is hook and warnings.filters == filters


def test_on_cuda_a_read_s_time_blocked_is_filed_at_its_sync_and_a_cuda_sync_has_none(
    cuda: FakeCuda,
) -> None:
    ticks = iter(range(0, 10**9, 1000))  # ns: each timed read is one step of the clock
    audit, patches = SyncSites([str(HERE)], cuda=cuda, clock=lambda: next(ticks)), Patches()
    audit.start(patches)
    try:
        cuda.initialise()
        synced = torch.Tensor._make_subclass(Syncing, torch.ones(2))
        read = lambda: synced.sum().item()  # noqa: E731
        # C calls __float__ at once: the read's end is heard before its sync's warning
        convert = lambda: float(synced.sum())  # noqa: E731
        host = lambda: X.sum().item()  # noqa: E731  no sync: nothing filed, no row
        bare = lambda: warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # noqa: E731
        for _ in range(2):
            read(), convert(), host(), bare()
    finally:
        audit.stop()
        patches.undo()
    rows = {(r["site"], r["call"]): (r["count"], r["blocked_s"]) for r in audit.rows(2)}
    assert rows.keys() == {(site(read), "Tensor.item"), (site(convert), "Tensor.__float__"),
                           (site(bare), CUDA_SYNC)}
    assert rows[site(read), "Tensor.item"] == (2, 2e-06)  # a tick each
    # torch looks __float__ up on the class to hand it to __torch_function__: a tick more each
    assert rows[site(convert), "Tensor.__float__"] == (2, 4e-06)
    assert rows[site(bare), CUDA_SYNC] == (2, None)
    assert sys.getprofile() is None


def test_on_cuda_never_started_stop_leaves_no_queued_call(cuda: FakeCuda) -> None:
    audit, patches = SyncSites([str(HERE)], cuda=cuda), Patches()
    audit.start(patches)
    assert len(cuda._queued_calls) == 1
    audit.stop()
    patches.undo()
    assert cuda._queued_calls == [] and cuda.mode == 0


# -- invisible: warnings, tracebacks, pickling, torch.compile --------------------------------------


def test_a_warning_inside_a_read_is_shown_at_the_script_s_line(sites: SyncSites) -> None:
    needs_grad = torch.ones(2, requires_grad=True).sum()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        convert = lambda: float(needs_grad)  # noqa: E731
        convert()
    assert [(Path(w.filename).name, w.lineno) for w in shown] == [
        (NAME, convert.__code__.co_firstlineno)]


def test_a_failing_read_s_traceback_has_no_runner_frame(sites: SyncSites) -> None:
    try:
        torch.ones(2).item()
    except RuntimeError as exc:
        files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    assert files == [__file__]


def test_patched_reads_pickle_as_torch_s(sites: SyncSites) -> None:
    for function in (torch.nonzero, torch.where, torch.Tensor.tolist, torch.Tensor.__getitem__):
        assert pickle.loads(pickle.dumps(function)) is function


# -- reads that cannot sync -----------------------------------------------------------------------


class Smoothed:
    """A logger's smoothed value, as torchvision's MetricLogger keeps one."""

    def __init__(self) -> None:
        self.values = collections.deque([1.0, 3.0, 2.0])

    def median(self) -> float:
        d = torch.tensor(list(self.values))
        return d.median().item()


def test_reads_of_host_built_tensors_and_while_loading_are_not_counted(sites: SyncSites) -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    sites.in_step = True
    assert Smoothed().median() == 2.0
    assert torch.as_tensor(3.0).item() == 3.0  # built here from a number, as the logger's
    loss = lambda: (weight * 2).sum().item()  # noqa: E731
    acc = lambda: (weight.detach().argmax() == 0).float().mean().item()  # noqa: E731
    loss(), acc()
    sites.loading = True
    X.sum().item()  # the dataset's own work, num_workers=0
    sites.loading = False
    # the model's loss and accuracy still count
    assert sorted(counted(sites)) == sorted([
        (site(loss), "Tensor.item", 1, True), (site(acc), "Tensor.item", 1, True)])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_compiled_model_gets_the_same_graphs_under_run(tmp_path: Path) -> None:
    started = start("compiled_reads.py")  # both at once: each is seconds of importing torch
    done, _ = under_run("compiled_reads.py", tmp_path)
    plain = started.wait()
    assert plain.returncode == 0 == done.returncode, done.stderr.decode()[-3000:]
    assert done.stdout == plain.stdout
    assert b"graph_break" not in plain.stdout or b"[]" in plain.stdout.splitlines()[1]
    err = done.stderr.decode()
    assert _logged(err[:err.index("asyncthrottle run")]) == _logged(plain.stderr.decode())


def _logged(err: str) -> str:
    """stderr without torch's log prefixes (time, process id, compile id)."""
    return re.sub(r"(?m)^[WIE]\d{4} [\d:.]+ \d+ (\S+)\] \[[\d/]+\]", r"\1", err)
