"""Lightning's per-step DDP SIGTERM broadcast, done every ``n`` training batches instead
(``sigterm_every=``).

Lightning >= 2.5.2 (PR #20825) runs, at the top of every
``_TrainingEpochLoop.advance`` when ``torch.distributed`` is initialized and
``trainer.world_size > 1``, ``_broadcast_sigterm_tensor()``: a tensor on the
root device, a ``broadcast`` from rank 0 and an ``.item()`` -- one host-device
sync per batch (Lightning-AI/pytorch-lightning #21487). :func:`install` swaps
it, on one trainer's epoch loop only (an instance attribute, removed by the
returned undo), for an exchange on the 1st, (n+1)th, (2n+1)th ... batch.

The semantics are the safe ones: Lightning's SIGTERM notifier (in the
installed SIGTERM handler) is swapped for one that forwards the signal
through the launcher once, as Lightning's does, but only records it, with no
out-of-band broadcast and without setting ``trainer.received_sigterm`` yet (a
lone rank raising early, or a broadcast paired with a gradient all-reduce,
would deadlock or break the group). At each exchange the ranks
``all_reduce(MAX)`` the flag: a SIGTERM on any rank makes every rank set
``received_sigterm``, meet at a barrier and raise ``SIGTERMException`` at the
same batch, at most ``n`` batches later. Only the code shape checked by
:func:`supported` is patched: Lightning 2.5.2 to 2.6.x (tested on 2.6).
"""

from __future__ import annotations

import contextlib
import importlib
import signal
from collections.abc import Callable
from typing import Any

import torch

# PR #20825: _broadcast_sigterm_tensor() at the top of every advance()
FIRST = (2, 5, 2)
# the newest series whose shape was tested
LAST = (2, 6, 99)


def version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _package(trainer: Any) -> Any:
    """The trainer's Lightning (``lightning.pytorch`` or ``pytorch_lightning``)."""
    top = type(trainer).__module__.split(".")[0]
    return importlib.import_module("lightning.pytorch" if top == "lightning" else top)


def _version_of(trainer: Any) -> tuple[int, ...]:
    try:
        return version(getattr(_package(trainer), "__version__", "0"))
    except ImportError:
        return (0,)


def supported(trainer: Any) -> str | None:
    """None when this trainer's Lightning has the per-step broadcast in the shape patched here; else
    why not."""
    found = _version_of(trainer)
    if not FIRST <= found <= LAST:
        return (f"Lightning {'.'.join(map(str, found))} is outside the versions it was tested on "
                "(2.5.2 to 2.6.x)")
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    advance = getattr(type(loop), "advance", None)
    if getattr(type(loop), "_broadcast_sigterm_tensor", None) is None or advance is None:
        return "trainer.fit_loop.epoch_loop has no _broadcast_sigterm_tensor"
    if "_broadcast_sigterm_tensor" not in getattr(getattr(advance, "__code__", None),
                                                  "co_names", ()):
        return f"{type(loop).__qualname__}.advance does not call _broadcast_sigterm_tensor"
    if "_broadcast_sigterm_tensor" in vars(loop):
        return "already patched"
    if not hasattr(getattr(trainer, "_signal_connector", None), "_sigterm_notifier_fn"):
        return "trainer._signal_connector has no _sigterm_notifier_fn"
    return None


def every_step(trainer: Any) -> bool:
    """Lightning will broadcast and ``.item()`` the SIGTERM flag at every training batch
    (``advance``'s condition)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    patched = loop is not None and "_broadcast_sigterm_tensor" in vars(loop)
    dist = torch.distributed
    return (_version_of(trainer) >= FIRST and not patched and dist.is_available()
            and dist.is_initialized() and getattr(trainer, "world_size", 1) > 1)


def install(trainer: Any, n: int) -> Callable[[], None]:
    """Exchange the SIGTERM flag every ``n`` training batches (safe semantics); returns an
    idempotent undo.

    Raises:
        RuntimeError: :func:`supported` says no.
    """
    why = supported(trainer)
    if why is not None:
        raise RuntimeError(why)
    if n == 1:
        # Lightning's own behaviour
        return lambda: None
    stop = _package(trainer).utilities.exceptions.SIGTERMException
    loop = trainer.fit_loop.epoch_loop
    connector = trainer._signal_connector
    state = {"calls": 0, "pending": False}

    # Lightning's, less the broadcast and the early flag
    def notifier(signum: int, frame: Any) -> None:
        if not connector.received_sigterm and not state["pending"]:
            launcher = trainer.strategy.launcher
            if launcher is not None:
                launcher.kill(signum)
        state["pending"] = True

    handlers = getattr(signal.getsignal(signal.SIGTERM), "signal_handlers", None)
    slot = None
    if isinstance(handlers, list):
        slot = next((i for i, h in enumerate(handlers) if h == connector._sigterm_notifier_fn),
                    None)
        if slot is None:
            raise RuntimeError("Lightning's SIGTERM notifier is not in the installed SIGTERM "
                               "handler")
        # no Lightning handler (Windows, not the main thread): nothing to defer
        handlers[slot] = notifier

    def exchange() -> None:
        state["calls"] += 1
        if (state["calls"] - 1) % n:
            return
        flag = 1 if (state["pending"] or connector.received_sigterm) else 0
        try:
            tensor = torch.tensor([flag], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        except Exception:
            tensor = torch.tensor([flag])
        if tensor.item() == 1:  # host-device sync: Lightning's SIGTERM exchange, every n batches
            connector.received_sigterm = True
            with contextlib.suppress(Exception):
                torch.distributed.barrier()
            raise stop()

    loop._broadcast_sigterm_tensor = exchange
    undone = [False]

    def undo() -> None:
        if undone[0]:
            return
        undone[0] = True
        vars(loop).pop("_broadcast_sigterm_tensor", None)
        if slot is not None and handlers is not None and handlers[slot] is notifier:
            handlers[slot] = connector._sigterm_notifier_fn
        # a signal in the last < n batches: trainer.received_sigterm tells the truth
        if state["pending"]:
            connector.received_sigterm = True

    return undo
