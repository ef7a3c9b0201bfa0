"""``forbid_syncs()``: the first host read of a device value in a training step raises SyncError at
its line, on the CPU by run's rule, on CUDA by its sync debug mode (a stand-in here); allow=,
nesting, threads, the decorator; torch's methods are torch's own again after every block."""

from __future__ import annotations

import inspect
import io
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import asyncthrottle  # noqa: E402
from asyncthrottle.audit.reads import CALLS  # noqa: E402
from asyncthrottle.parts.syncaudit import SYNC_MESSAGE  # noqa: E402
from asyncthrottle.testing import SyncError, forbid, forbid_syncs  # noqa: E402

NAME = Path(__file__).name


class Step:
    """A tiny training step: the loss, with its autograd history, after the update."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.x, self.y = torch.randn(8, 4), torch.randn(8, 1)

    def __call__(self) -> Any:
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()  # torch's own reads of its step counter are no sync
        return loss


@pytest.fixture
def step() -> Step:
    return Step()


def line_of(read: Callable[..., Any]) -> int:
    return read.__code__.co_firstlineno


def raised_at(excinfo: pytest.ExceptionInfo[SyncError], call: str, read: Callable[..., Any]) -> None:
    error = excinfo.value
    assert (error.call, error.path, error.line, error.via) == (call, __file__, line_of(read), None)
    assert error.site.endswith(f"{NAME}:{line_of(read)}")
    assert f"{call} at {error.site} reads a device value" in str(error)
    assert f"forbid_syncs(allow=({call!r},))" in str(error)


READS: list[tuple[Callable[[Any], Any], str]] = [
    (lambda loss: loss.item(), "Tensor.item"),
    (lambda loss: float(loss), "Tensor.__float__"),
    (lambda loss: bool(loss < 10), "Tensor.__bool__"),
    (lambda loss: 1 if loss > 0 else 0, "Tensor.__bool__"),
    (lambda loss: f"{loss:.3f}", "Tensor.__format__"),
    (lambda loss: loss.detach().cpu(), "Tensor.cpu"),
]


@pytest.mark.parametrize(("read", "call"), READS, ids=[f"{c}@{i}" for i, (_, c) in enumerate(READS)])
def test_a_read_in_a_training_step_raises_at_its_line(
        step: Step, read: Callable[[Any], Any], call: str) -> None:
    with pytest.raises(SyncError) as excinfo, forbid_syncs():
        loss = step()
        read(loss)
    raised_at(excinfo, call, read)


def test_the_step_itself_and_reads_that_stay_on_the_host_pass(step: Step) -> None:
    def smoothed(values: list[float]) -> float:
        return torch.tensor(values).median().item()  # a logger's: built from host data here

    with forbid_syncs():
        for _ in range(3):
            loss = step()
        median = smoothed([1.0, 3.0, 2.0])
        batches = list(torch.utils.data.DataLoader(Labelled(), batch_size=2))
    assert median == 2.0 and len(batches) == 2
    assert loss.item() > 0  # after the block: no error


# torch's own code reads these on the host: on an accelerator each syncs, when its tensor lives
# on the device (a model's output, its parameters, a tensor made with device=)
DEVICE = torch.device("cpu")  # the script's device: "cuda" on a GPU
TORCH_READS: list[tuple[Callable[[Any], Any], str]] = [
    (lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, error_if_nonfinite=True),
     "Tensor.__bool__"),
    (lambda m: torch.distributions.Normal(m(torch.ones(1, 4)), 1.0, validate_args=True),
     "Tensor.__bool__"),
    (lambda m: complex(m(torch.ones(1, 4)).sum()), "Tensor.__complex__"),
    (lambda m: torch.repeat_interleave(torch.ones(2), torch.tensor([1, 2], device=DEVICE)),
     "torch.repeat_interleave"),
    (lambda m: torch.ones(2).repeat_interleave((m.weight[0, :2] > -9).long()),
     "Tensor.repeat_interleave"),
    (lambda m: torch.save(m.state_dict(), io.BytesIO()), "torch.save"),
]
# the same calls on host tensors: no sync on any device
HOST_CALLS: list[Callable[[], Any]] = [
    lambda: torch.distributions.Normal(torch.tensor(0.0), torch.tensor(1.0), validate_args=True),
    lambda: complex(torch.tensor(1.5)),
    lambda: torch.repeat_interleave(torch.ones(2), torch.tensor([1, 2])),
    lambda: torch.ones(2).repeat_interleave(torch.tensor([1, 2]), output_size=3),
    lambda: torch.save({"table": torch.arange(3)}, io.BytesIO()),
]


@pytest.mark.parametrize(("read", "call"), TORCH_READS,
                         ids=[f"{c}@{i}" for i, (_, c) in enumerate(TORCH_READS)])
def test_torch_s_own_read_of_a_device_tensor_raises_at_the_line_that_called_torch(
        step: Step, read: Callable[[Any], Any], call: str) -> None:
    step.model.weight.grad = torch.ones_like(step.model.weight)
    with pytest.raises(SyncError) as excinfo, forbid_syncs():
        read(step.model)
    raised_at(excinfo, call, read)


@pytest.mark.parametrize("call", HOST_CALLS)
def test_torch_s_own_read_of_a_host_tensor_passes(call: Callable[[], Any]) -> None:
    with forbid_syncs():
        call()


class Ema(torch.nn.Module):
    """An exponential moving average's step counter, as ema-pytorch keeps it: registered buffers
    (on the device with the model), read every update, in a function that also builds a host
    tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("initted", torch.tensor(False))
        self.register_buffer("step", torch.tensor(0))

    def update(self) -> int:
        step = self.step.item()
        self.step += 1
        if not self.initted.item():
            self.initted.copy_(torch.tensor(True))
        return int(step)


def schedule(points: list[float]) -> Callable[[float], float]:
    """A one-cycle schedule as fastai combines one: a host tensor built from Python floats in
    the outer function, read by the inner one every step."""
    pcts = torch.tensor([0.0, *points])

    def at(pos: float) -> float:
        idx = (pos >= pcts).nonzero().max()
        part = (pos - pcts[idx]) / (pcts[idx + 1] - pcts[idx])
        return part.item()

    return at


def test_a_module_s_buffers_are_on_the_device_and_a_host_schedule_is_not() -> None:
    ema = Ema()
    with forbid_syncs():
        # made inside: what the audit saw built from floats (under run: all the script makes)
        at = schedule([0.25, 1.0])
        assert at(0.5) == pytest.approx(1 / 3)
        with pytest.raises(SyncError) as excinfo:
            ema.update()
    assert (excinfo.value.call, excinfo.value.line) == (
        "Tensor.item", line_of(Ema.update) + 1)
    with forbid_syncs(allow=("Tensor.item",)):
        assert ema.update() == 0  # built before the block: a module's buffer all the same


def test_a_writer_in_torch_reading_the_loss_raises_at_the_script_s_line(step: Step) -> None:
    # torch's tensorboard writer turns a scalar into NumPy: .detach().cpu().numpy()
    make_np = _in_torch("def make_np(x):\n    return x.detach().cpu().numpy()\n")["make_np"]
    log = lambda loss: make_np(loss)  # noqa: E731
    with pytest.raises(SyncError) as excinfo, forbid_syncs():
        log(step())
    raised_at(excinfo, "Tensor.cpu", log)
    with forbid_syncs():
        make_np(torch.tensor(2.0))  # a host value: no sync


def _in_torch(source: str) -> dict[str, Any]:
    """Functions whose frames are torch's files."""
    scope: dict[str, Any] = {}
    path = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "_forbid_test_fake.py")
    exec(compile(source, path, "exec"), scope)
    return scope


class Labelled(torch.utils.data.Dataset):
    """A dataset that reads a tensor in __getitem__: the DataLoader's fetch stays on the host."""

    def __init__(self) -> None:
        self.labels = torch.arange(4.0).requires_grad_()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> float:
        return self.labels[index].item()


def test_allow_lets_the_named_calls_through_and_no_other(step: Step) -> None:
    with forbid_syncs(allow=("Tensor.item", "Tensor.__format__")):
        loss = step()
        logged = f"{loss.item():.3f} {loss:.3f}"
        with pytest.raises(SyncError) as excinfo:
            read = lambda: float(loss)  # noqa: E731
            read()
    assert logged.count(".") == 2
    raised_at(excinfo, "Tensor.__float__", read)


@pytest.mark.parametrize("allow", [("item",), ("Tensor.items",), ("Tensor.item", "CUDA-sync")])
def test_an_unknown_call_is_a_value_error_listing_the_known_ones(allow: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=r"which is no read forbid_syncs\(\) knows") as excinfo:
        forbid_syncs(allow=allow)
    message = str(excinfo.value)
    assert "Tensor.item, Tensor.__bool__" in message and "torch.where, CUDA sync" in message
    assert "did you mean" in message


def test_allow_must_be_a_tuple_of_names_and_a_function_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"allow must be a tuple of call names, got 'Tensor.item': "
                                        r"e.g. allow=\('Tensor.item',\)"):
        forbid_syncs(allow="Tensor.item")
    with pytest.raises(TypeError, match=r"forbid_syncs\(\) takes a function to decorate, got "
                                        r"\('Tensor.item',\)"):
        forbid_syncs(("Tensor.item",))  # type: ignore[call-overload]


def test_a_generator_or_coroutine_function_cannot_be_decorated() -> None:
    async def coroutine() -> None:
        pass

    def generator() -> Iterator[int]:
        yield 1

    for func in (coroutine, generator):
        with pytest.raises(TypeError, match=r"use `with forbid_syncs\(\):` inside it"):
            forbid_syncs(func)
        with pytest.raises(TypeError, match="its body runs after the call returns"):
            forbid_syncs(allow=("Tensor.item",))(func)


def test_an_inner_allow_adds_to_the_outer_one_until_it_ends(step: Step) -> None:
    with forbid_syncs():
        loss = step()
        with forbid_syncs(allow=("Tensor.item",)):
            loss.item()
        with pytest.raises(SyncError, match=r"Tensor\.item\b"):
            loss.item()  # the inner block ended
    with forbid_syncs(allow=("Tensor.item",)):
        with forbid_syncs():
            loss.item()  # the outer block allows it: an inner one cannot take that back
            with pytest.raises(SyncError, match=r"Tensor\.__float__\b"):
                float(loss)
    loss.item()


def test_only_the_thread_that_entered_is_watched(step: Step) -> None:
    read, errors = [], []

    def other() -> None:
        try:
            read.append(loss.item())
            with forbid_syncs():
                pass
        except Exception as exc:
            errors.append(exc)

    with forbid_syncs():
        loss = step()
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        with pytest.raises(SyncError):
            loss.item()
    assert read == [pytest.approx(loss.item())]
    assert [type(e) for e in errors] == [RuntimeError]
    assert "watches one thread at a time" in str(errors[0])


def test_repr_raises_when_the_block_ends(step: Step) -> None:
    """Python's repr() hides an error of its lookup behind the default repr."""
    with pytest.raises(SyncError) as excinfo, forbid_syncs():
        loss = step()
        read = lambda: repr(loss)  # noqa: E731
        read()
        reached = True
    assert reached
    raised_at(excinfo, "Tensor.__repr__", read)


# -- the decorator --------------------------------------------------------------------------------


def test_a_decorated_function_raises_at_its_own_line_and_keeps_its_name(step: Step) -> None:
    @forbid_syncs
    def train(steps: int, *, log: bool = False) -> float:
        """Trains."""
        for _ in range(steps):
            loss = step()
        return float(loss) if log else 0.0

    assert train(2) == 0.0
    with pytest.raises(SyncError) as excinfo:
        train(1, log=True)
    assert excinfo.value.line == line_of(train.__wrapped__) + 5  # type: ignore[attr-defined]
    assert train.__name__ == "train" and train.__doc__ == "Trains."
    assert str(inspect.signature(train)) == "(steps: 'int', *, log: 'bool' = False) -> 'float'"
    assert_restored()


@forbid_syncs(allow=("Tensor.item",))
def test_a_decorated_test_gets_its_fixtures_and_its_allow(step: Step, tmp_path: Path) -> None:
    loss = step()
    assert loss.item() > 0 and tmp_path.is_dir()
    with pytest.raises(SyncError, match=r"Tensor\.tolist\b"):
        loss.tolist()


# -- nothing left behind --------------------------------------------------------------------------


def _state() -> dict[str, Any]:
    """torch's read methods and functions, the DataLoader's fetch, the sync debug hooks."""
    from torch.utils.data import dataloader

    # the class's own attributes (a read left on it is one more) and each read as looked up
    found = {f"vars.{name}": value for name, value in vars(torch.Tensor).items()
             if name != "__slotnames__"}
    for call in CALLS:
        owner, _, name = call.partition(".")
        found[call] = inspect.getattr_static(torch.Tensor if owner == "Tensor" else torch, name)
    found.update({name: vars(getattr(dataloader, name))["_next_data"] for name in (
        "_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter")})
    found["showwarning"] = warnings.showwarning
    return found


PRISTINE = _state()


def assert_restored() -> None:
    now = _state()
    assert now.keys() == PRISTINE.keys()
    assert [name for name, value in PRISTINE.items() if now[name] is not value] == []
    assert forbid._watch is None


def test_everything_is_restored_after_a_block_an_error_and_one_block_after_another(
        step: Step) -> None:
    with forbid_syncs():
        assert inspect.getattr_static(torch.Tensor, "item") is not PRISTINE["Tensor.item"]
        step()
    assert_restored()
    with pytest.raises(ZeroDivisionError), forbid_syncs():
        1 / 0  # noqa: B018
    assert_restored()
    for _ in range(2):  # each block installs afresh and still raises
        with pytest.raises(SyncError), forbid_syncs():
            step().item()
        assert_restored()
    step().item()


# -- CUDA: its sync debug mode decides ------------------------------------------------------------


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """torch.cuda's lazy init and sync debug mode, for a machine with no GPU: CUDA initialises
    when the test calls the queued calls."""
    stand_in = SimpleNamespace(mode=0, _queued_calls=[])
    stand_in.get_sync_debug_mode = lambda: stand_in.mode
    stand_in.set_sync_debug_mode = lambda mode: setattr(stand_in, "mode", mode)
    stand_in._lazy_call = lambda call: stand_in._queued_calls.append((call, []))
    monkeypatch.setattr(forbid, "_cuda", lambda: stand_in)
    yield stand_in
    assert stand_in.mode == 0 and stand_in._queued_calls == []


def test_on_cuda_a_sync_it_reports_raises_and_a_read_that_did_not_sync_passes(
        cuda: SimpleNamespace, step: Step) -> None:
    hook = warnings.showwarning
    with pytest.raises(SyncError) as excinfo, forbid_syncs():
        for call, _ in cuda._queued_calls:
            call()  # CUDA initialises inside the block
        assert cuda.mode == "warn"
        loss = step()
        loss.item()  # a CPU tensor: CUDA reports no sync
        synced = lambda: warnings.warn(SYNC_MESSAGE, UserWarning, stacklevel=1)  # noqa: E731
        synced()
    raised_at(excinfo, "CUDA sync", synced)
    assert warnings.showwarning is hook
    with warnings.catch_warnings(record=True) as shown, forbid_syncs(allow=("CUDA sync",)):
        warnings.simplefilter("always")
        cuda._queued_calls.pop()[0]()
        synced()
    assert shown == []  # allowed: neither raised nor shown


def test_sync_error_is_the_package_s_and_pickles() -> None:
    import pickle

    error = SyncError("Tensor.item", "train.py:3", "/abs/train.py", 3, "pkg/core.py:9")
    again = pickle.loads(pickle.dumps(error))
    assert asyncthrottle.SyncError is SyncError and isinstance(error, RuntimeError)
    assert (again.call, again.site, again.line, again.via, str(again)) == (
        "Tensor.item", "train.py:3", 3, "pkg/core.py:9", str(error))
    assert "Tensor.item at train.py:3 (made by pkg/core.py:9)" in str(error)


def test_inside_run_s_audit_the_audit_s_own_reads_are_put_back_after_a_block(step: Step) -> None:
    # a script under python -m asyncthrottle run that uses forbid_syncs(): the audit's patches
    # (descriptors on torch.Tensor) are what the block restores, not torch's methods
    from asyncthrottle.audit.patches import Patches
    from asyncthrottle.audit.syncsites import SyncSites

    sites, patches = SyncSites([str(Path(__file__).parent)]), Patches()
    sites.start(patches)
    try:
        audited = inspect.getattr_static(torch.Tensor, "item")
        assert audited is not PRISTINE["Tensor.item"]
        with pytest.raises(SyncError), forbid_syncs():
            step().item()
        assert inspect.getattr_static(torch.Tensor, "item") is audited
    finally:
        sites.stop()
        patches.undo()
    assert_restored()
