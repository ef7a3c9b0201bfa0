"""The DataLoader a loop draws from, as the report says it: what the script wrote, with what torch
runs beside it where they differ (``pin_memory=True`` is off without an accelerator), and the real
batch size where a framework batches itself over a torch DataLoader made with ``batch_size=None``
(fastai's ``DataLoader``).

torch's iterator copies its DataLoader's ``num_workers`` (``_num_workers``), and takes its batches
from the DataLoader's batch sampler (``_index_sampler``: a ``BatchSampler(batch_size=...)``, or the
script's own ``batch_sampler=``); its ``_pin_memory`` is the DataLoader's ``pin_memory`` and an
accelerator being available (and never on MPS). The iterator keeps no reference to its
DataLoader: the runner hands it over where ``DataLoader._get_iterator`` makes the iterator
(:mod:`~asyncthrottle.run.torchhooks`); an iterator made by hand from a loader that is its own
dataset (fastai's ``_FakeLoader``) is found through its dataset."""

from __future__ import annotations

from typing import Any

__all__ = ["describe", "said"]

# the attributes that name the batch size of a framework's loader (fastai's ``bs``) or of a
# dataset that yields whole batches
_SIZES = ("bs", "batch_size")


def describe(iterator: Any, loader: Any = None) -> dict[str, Any]:
    """The report's ``loader`` for a torch DataLoader ``iterator`` made from ``loader`` (None: not
    known; a loader that is its own dataset is then found through the iterator): ``pin_memory``
    as written (None where no loader is known), ``pin_memory_in_effect`` as torch runs it, and
    ``pin_memory_off`` why not where it was written; ``batch_size`` the batches' size and
    ``batched_by`` the class that makes them where torch's DataLoader does not batch (None where
    it does). Only attributes are read, never a tensor: nothing here syncs."""
    if loader is None:
        loader = _own_dataset(iterator)
    written = _flag(getattr(loader, "pin_memory", None)) if loader is not None else None
    in_effect = bool(getattr(iterator, "_pin_memory", False))
    off = None
    if written and not in_effect:
        # the accelerator torch would pin for (its iterator keeps it only while pinning)
        device = getattr(iterator, "_pin_memory_device", None)
        off = "no accelerator" if device is None else f"torch does not pin memory for {device}"
    size, batched_by = _batches(iterator)
    return {"num_workers": getattr(iterator, "_num_workers", 0), "pin_memory": written,
            "pin_memory_in_effect": in_effect, "pin_memory_off": off,
            "batch_size": size, "batched_by": batched_by}


def said(loader: dict[str, Any], *, pinning: bool = True) -> str:
    """``DataLoader(num_workers=0, pin_memory=True (off: no accelerator), batch_size=4)``: the
    report's ``loader`` as the script wrote it, what torch runs with beside it where it differs;
    without ``pinning`` (the steps run on the host: no copy to pin for) no ``pin_memory``. A
    report older than ``pin_memory_in_effect`` said what was in effect."""
    parts = [f"num_workers={loader.get('num_workers', 0)}"]
    if pinning:
        parts.append(f"pin_memory={_pinned(loader)}")
    if "batch_size" in loader:
        by = loader.get("batched_by")
        parts.append(f"batch_size={loader['batch_size']}"
                     + (f" (batched by {_framework(by)})" if by else ""))
    return f"DataLoader({', '.join(parts)})"


def _pinned(loader: dict[str, Any]) -> str:
    written = loader.get("pin_memory")
    in_effect = loader.get("pin_memory_in_effect", written)
    if written is None:
        return f"{in_effect} (in effect)"
    if in_effect is None or bool(in_effect) == bool(written):
        return str(written)
    if written:
        return f"True (off: {loader.get('pin_memory_off') or 'torch does not pin here'})"
    return "False (on)"


def _framework(name: Any) -> str:
    """``fastai.data.core.TfmdDL`` as ``fastai's TfmdDL``."""
    package, _, rest = str(name).partition(".")
    return f"{package}'s {rest.rpartition('.')[2]}" if rest else package


def _flag(value: Any) -> bool | None:
    return bool(value) if isinstance(value, int) else None


def _batches(iterator: Any) -> tuple[int | None, str | None]:
    """The batches' size, and who makes them where torch does not: a DataLoader made with
    ``batch_size=None`` hands on its dataset's items whole, so a dataset that batches (a
    ``bs``/``batch_size`` of its own), or an object it holds that does (fastai's ``_FakeLoader``
    holds the fastai ``DataLoader``, ``bs``), makes them. Instance attributes only: no property
    or ``__getattr__`` of the script's runs."""
    if getattr(iterator, "_auto_collation", True):
        # torch batches: the DataLoader's batch_size= (its BatchSampler), or its batch_sampler='s
        return _size(getattr(getattr(iterator, "_index_sampler", None), "batch_size", None)), None
    dataset = getattr(iterator, "_dataset", None)
    for holder in (dataset, *_attributes(dataset).values()):
        own = _attributes(holder)
        for name in _SIZES:
            size = _size(own.get(name))
            if size is not None:
                return size, f"{type(holder).__module__}.{type(holder).__qualname__}"
    return None, None


def _size(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _attributes(value: Any) -> dict[str, Any]:
    """``value``'s instance dict, read past any ``__getattribute__``/``__getattr__`` of its class
    ({} where it has none)."""
    try:
        found = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return found if isinstance(found, dict) else {}


def _own_dataset(iterator: Any) -> Any:
    """The loader an iterator was made from by hand where that loader is its own dataset (fastai's
    ``_FakeLoader``), else None."""
    dataset = getattr(iterator, "_dataset", None)
    return dataset if _attributes(dataset).get("dataset") is dataset else None
