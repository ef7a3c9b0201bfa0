"""Deferred values: snapshots of a step's values on their way to the host, delivered in step order
once it completes."""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
from collections import UserDict, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .core.events import Event
from .core.rule import tell_rest

if TYPE_CHECKING:
    from .core.rule import Core

_log = logging.getLogger("asyncthrottle")
OnComplete = Callable[[int, dict[str, Any]], None]
# steps of ring slots kept when depth=None bounds nothing
UNBOUNDED_STEPS = 4


def _map(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to every leaf of its mappings, lists, tuples, namedtuples and
    dataclasses.

    Containers are rebuilt without running their ``__init__``: a dict
    subclass or a ``UserDict`` (transformers' ``BatchEncoding``) is a shallow
    copy holding the new items, so it keeps its other attributes (a
    ``BatchEncoding``'s encodings, a ``defaultdict``'s factory); a dataclass
    is a shallow copy whose fields are set directly, so ``__post_init__`` does
    not run again (frozen ones and ``InitVar`` fields too). Any other mapping
    keeps its type where the type can be built from a dict; else it becomes a dict.
    """
    kind = type(value)
    # The usual value is one leaf (a loss): its type is known after the first, and no ABC is asked.
    if kind in _LEAVES:
        return leaf(value)
    if kind is dict:
        # the other usual value, a dict of metrics: no ABC asked, and no call per known leaf
        # (a loop, not a comprehension: 3.11 makes a comprehension a call)
        mapped: dict[Any, Any] = {}
        for key, item in value.items():
            mapped[key] = leaf(item) if type(item) in _LEAVES else _map(item, leaf)
        return mapped
    if isinstance(value, Mapping):
        mapped = {key: _map(item, leaf) for key, item in value.items()}
        if type(value) is dict:
            return mapped
        return _rebuild_mapping(value, mapped)
    # a namedtuple
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map(item, leaf) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, leaf) for item in value)
    # an instance, not the class
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rebuilt = copy.copy(value)
        for field in dataclasses.fields(value):
            # frozen ones too
            object.__setattr__(rebuilt, field.name, _map(getattr(value, field.name), leaf))
        return rebuilt
    if len(_LEAVES) < 64:
        _LEAVES.add(kind)
    return leaf(value)


# Types seen to be leaves (not mappings, sequences or dataclasses), at most 64 of them.
_LEAVES: set[type] = set()


def _rebuild_mapping(value: Mapping[Any, Any], mapped: dict[Any, Any]) -> Any:
    """A mapping of ``value``'s type holding ``mapped``, keeping ``value``'s other state where it
    can."""
    try:
        if isinstance(value, UserDict):
            out: Any = copy.copy(value)
            out.data = mapped
            return out
        if isinstance(value, dict):
            out = copy.copy(value)
            dict.clear(out)
            dict.update(out, mapped)
            return out
        return type(value)(mapped)  # type: ignore[call-arg]
    except Exception:
        # a type that cannot be copied or built from a dict
        return mapped


class Snapshot:
    """Takes the snapshot of one value's leaves, as :meth:`Completions.defer` does.

    A JAX array is held as it is (it is immutable; only a donation can take it),
    or copied on the device with ``copy=True``; off the CPU its host copy is
    started. A CUDA tensor is copied non-blocking into a slot of the pinned
    ring, on the current stream (whose key, not a Python ``Stream``, is kept).

    Args:
        synchronous: the throttle runs synchronously (no event orders the
            copies), so a copy from a device blocks until it is done.
        copy: copy JAX arrays on the device (they survive a later donation).
        owner: gives the pinned ring and the stream keys, on the first CUDA tensor.
    """

    __slots__ = ("copy", "held", "owner", "ringed", "synchronous")

    def __init__(self, synchronous: bool, copy: bool = False,
                 owner: Completions | None = None) -> None:
        self.synchronous, self.copy, self.owner = synchronous, copy, owner
        # JAX arrays held as they are: a donation can delete them
        self.held: list[Any] = []
        # a leaf is a view into the pinned ring, copied out when its step retires
        self.ringed = False

    def __call__(self, value: Any) -> Any:
        off_cpu = _JAX_ARRAYS.get(type(value))
        if off_cpu is not None and not self.copy:
            # the usual leaf of a dict of metrics, a JAX array of a type seen before: _jax without
            # its calls
            self.held.append(value)
            if off_cpu:
                value.copy_to_host_async()
            return value
        # a tensor exists only if torch was imported
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            host, ringed = tensor_snapshot(value, self.synchronous, self.owner)
            self.ringed = self.ringed or ringed
            return host
        # a JAX array
        if hasattr(value, "copy_to_host_async"):
            return self._jax(value)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.ndarray):
            # a snapshot: the caller may update the array in place
            return value.copy()
        return value

    def _jax(self, array: Any) -> Any:
        if len(_JAX_ARRAYS) < 8 and type(array) not in _JAX_ARRAYS:
            _JAX_ARRAYS[type(array)] = _jax_off_cpu()
        if self.copy and hasattr(array, "copy"):
            # dispatched, never blocks; nobody else holds it, so nobody donates it
            array = array.copy()
        else:
            self.held.append(array)
        if _jax_off_cpu():
            # starts the device-to-host copy; on the CPU it would buy nothing
            array.copy_to_host_async()
        return array


def tensor_snapshot(tensor: Any, synchronous: bool, owner: Completions | None) -> tuple[Any, bool]:
    """The snapshot of one torch tensor, and whether it is a view into the pinned ring (see
    :class:`Snapshot`)."""
    if tensor.requires_grad:
        # (only then: detach() is a torch call, ~0.4 us)
        tensor = tensor.detach()
    # (is_cpu and is_cuda make no torch.device: 0.08 against 0.5 us)
    if tensor.is_cpu:
        # a snapshot: the caller may update the tensor in place
        return tensor.clone(), False
    if synchronous:
        return tensor.to("cpu"), False  # host-device sync: no order for a non-blocking copy here
    if owner is not None:
        # CUDA and XPU tensors: into the pinned ring (is_xpu read only off CUDA)
        kind = "cuda" if tensor.is_cuda else "xpu" if tensor.is_xpu else None
        if kind is not None:
            host = owner._ring_copy(tensor, kind)
            if host is not None:
                return host, True
    # Non-blocking device-to-host copy (torch pins it, except for MPS, whose memory the host
    # shares), enqueued before the step's event.
    return tensor.to("cpu", non_blocking=True), False


# [whether JAX's default backend is not the CPU], once asked
_OFF_CPU: list[bool] = []
# the types of JAX arrays seen (jaxlib's ArrayImpl), each with whether JAX runs off the CPU: a bare
# one is deferred and read without _map
_JAX_ARRAYS: dict[type, bool] = {}


def _jax_off_cpu() -> bool:
    """Whether JAX runs off the CPU here (a GPU or TPU is its default backend); asked once per
    process."""
    if not _OFF_CPU:
        _OFF_CPU.append(sys.modules["jax"].default_backend() != "cpu")
    return _OFF_CPU[0]


def snapshot(value: Any, synchronous: bool = False) -> tuple[Any, list[Any]]:
    """Start copying ``value`` (tensors, arrays, nested dicts/lists/tuples) to the host.

    Returns the snapshot and the JAX arrays it holds as they are.
    """
    copier = Snapshot(synchronous)
    return _map(value, copier), copier.held


def _host_leaf(value: Any) -> Any:
    """A leaf of a completed step's snapshot, on the host: JAX arrays become numpy arrays."""
    off_cpu = _JAX_ARRAYS.get(type(value))
    if off_cpu is not None:
        # a JAX array of a type seen before: _jax_to_host without its calls
        numpy = sys.modules["numpy"]
        return numpy.asarray(value) if off_cpu else numpy.array(value)
    if hasattr(value, "copy_to_host_async"):
        return _jax_to_host(value)
    return value


def _jax_to_host(array: Any) -> Any:
    """A complete JAX array as a numpy array (neither way waits)."""
    import numpy as np

    # On the CPU, np.asarray would be a view that silently keeps the user's later donation of the
    # array from happening: take a copy.
    return np.array(array) if not _jax_off_cpu() else np.asarray(array)


def _unring_leaf(value: Any) -> Any:
    """A leaf of a snapshot with ring views: tensors are copied out of the ring (its slot is
    reused)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.clone()
    return _host_leaf(value)


class DonatedValueError(RuntimeError):
    """A deferred JAX array was donated to a jitted call before its step completed: its value is
    lost.

    Raised by ``Deferred.get()`` and by the throttle call that delivers the
    step (the hand-out, ``drain()`` or wait that retires it), after the step's
    other values went to ``latest`` and the callbacks.

    Attributes:
        step: the step the value was deferred in.
        name: the value's name.
        seen_at: the step at whose end the deletion was first seen (None: at delivery).
    """

    def __init__(self, step: int, name: str, seen_at: int | None) -> None:
        self.step, self.name, self.seen_at = step, name, seen_at
        seen = (f"seen at the end of step {seen_at}" if seen_at is not None
                else "seen when the step was delivered")
        super().__init__(
            f"the value {name!r} deferred in step {step} was donated before step {step} completed "
            f"({seen}): a jitted call with donate_argnums/donate_argnames took its buffer, and JAX "
            "keeps no host copy of a donated array, so the value is lost; defer an array that no "
            "later call donates (the step's loss output rather than its donated state), or defer a "
            f"device copy: thr.defer(value, name={name!r}, copy=True)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled and copied by its own arguments (a worker's error crosses a process pool)
        return type(self), (self.step, self.name, self.seen_at), self.__dict__

    def _fresh(self) -> DonatedValueError:
        """The same error without a traceback: the kept one is raised as a copy, so that each
        raise has its own frames (none gathered, no cycle through them)."""
        return copy.copy(self)


class Deferred:
    """A value from one step, readable once that step is complete.

    ``ready()`` never blocks. ``get()`` waits for this value's step only --
    never for a later step, never a device-wide sync. Both are safe from any
    thread: from the loop's thread the wait counts as host wait in the
    throttle's stats; from another thread it waits on the step's own event
    and changes nothing in the throttle.

    Attributes:
        step: the step the value belongs to.
        name: its name in ``Throttle.latest`` and ``on_complete`` callbacks.
        unnamed: ``defer()`` chose the name (``"value"``, ``"value_1"``, ...).
    """

    __slots__ = (
        "_copied", "_done", "_dropped", "_event", "_held", "_host", "_lost", "_ringed", "_settled",
        "_wait", "name", "step", "unnamed",
    )

    def __init__(
        self, step: int, name: str, host: Any, wait: Callable[[Deferred], None],
        unnamed: bool = False, held: list[Any] | None = None, ringed: bool = False,
    ) -> None:
        self.step, self.name, self.unnamed = step, name, unnamed
        self._host, self._wait = host, wait
        # the step's event, once recorded
        self._event: Event | None = None
        # the step was seen complete
        self._done = False
        # the step ended without an event: the value never arrives
        self._dropped = False
        # JAX arrays held as they are, until the value is on the host
        self._held = held
        # leaves are views into the pinned ring, until the value is on the host
        self._ringed = ringed
        # _host holds the value on the host
        self._settled = False
        # a held array was donated before its step completed
        self._lost: DonatedValueError | None = None
        # events recorded after its copies on streams the step's event cannot join (None: none)
        self._copied: list[Any] | None = None

    def _donated(self, seen_at: int | None) -> bool:
        """Whether a held array was deleted (donated); the first time, remembers where it was seen.
        0.05 us each."""
        if self._lost is None:
            held = self._held
            if not held or not any(array.is_deleted() for array in held):
                return False
            self._lost = DonatedValueError(self.step, self.name, seen_at)
        return True

    def _settle(self) -> Any:
        """The value on the host, made once the step is complete (the device arrays and ring slot
        are let go)."""
        if not self._settled:
            copied = self._copied
            if copied:
                for marker in copied:
                    # host-device sync: this copy's stream is not one the step's event covers; it
                    # was enqueued with the step, so it is done or nearly
                    marker.synchronize()
            host = self._host
            off_cpu = _JAX_ARRAYS.get(type(host))
            if off_cpu is not None:
                # the usual value, one JAX array, without the walk (see _jax_to_host)
                numpy = sys.modules["numpy"]
                self._host = numpy.asarray(host) if off_cpu else numpy.array(host)
            elif self._ringed and type(host) is sys.modules["torch"].Tensor:
                # the other usual value, one tensor in a ring slot: _unring_leaf without the walk
                self._host = host.clone()
            else:
                self._host = _map(host, _unring_leaf if self._ringed else _host_leaf)
            self._settled, self._held = True, None
        return self._host

    def _recorded(self, event: Event | None) -> None:
        self._event = event
        # a synchronous step is complete as it is recorded
        self._done = event is None

    def ready(self) -> bool:
        """True once the step is complete (never for a dropped value). Queries; never blocks."""
        if self._done:
            return True
        event = self._event
        if event is None or not event.query():
            return False
        copied = self._copied
        return not copied or all(marker.query() for marker in copied)

    def get(self) -> Any:
        """The value on the host, waiting for its step if needed (a host-device sync on that step).

        Raises:
            RuntimeError: the step ended without an event (its body raised, or
                its event could not be recorded), so the value never arrives;
                or the step has not ended yet.
            DonatedValueError: a JAX array of the value was donated before
                its step completed (see ``Throttle.defer``'s ``copy``).
        """
        if self._dropped:
            raise RuntimeError(
                f"the value {self.name!r} of step {self.step} will never arrive: its step ended "
                "without an event (its body raised, or its event could not be recorded)"
            )
        if not self.ready():
            self._wait(self)
        if self._donated(None):
            # a new error each time: the kept one gathers no traceback (frames that hold this)
            raise self._lost._fresh()  # type: ignore[union-attr]
        return self._settle()

    def item(self) -> float:
        """The value as a Python number (one-element tensors and arrays)."""
        value = self.get()
        return float(value.item()) if hasattr(value, "item") else float(value)

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        state = "ready" if self.ready() else "pending"
        return f"Deferred(step={self.step}, name={self.name!r}, {state})"


class Completions:
    """Deferred values and ``on_complete`` callbacks; subscribes to the core on first use.

    A value belongs to the step the host is in when it is deferred. Its step's
    event is attached when the step is recorded; when the core retires the
    step, its values go to :attr:`latest` and to every callback. The values of
    a step that ended without an event (its body raised, or its record failed)
    are dropped with it (:meth:`on_drop`): their ``get()`` says so.

    A name deferred more than once in a step (gradient accumulation) keeps
    every value: it maps to the list of them, in order.

    Args:
        core: the throttle's core.
        wait: how ``Deferred.get()`` waits for an unfinished step.
    """

    def __init__(self, core: Core, wait: Callable[[Deferred], None]) -> None:
        self.core, self._wait = core, wait
        # the current step's values, until it is recorded
        self.open: list[Deferred] = []
        # keys of the CUDA (XPU) streams the current step's copies were enqueued on
        self.stream_keys: list[Any] = []
        # unretired values holding JAX arrays, in step order
        self.holding: deque[Deferred] = deque()
        # the PinnedRing of CUDA (or XPU) snapshots, made at the first such tensor
        self.ring: Any = None
        # its TorchSnapshots (pinned buffers, stream keys)
        self.model: Any = None
        # ring copies in the current step
        self._ring_leaves = 0
        # a step's copies were on a stream its event cannot join (said once)
        self._unordered = False
        # (step, events recorded after such copies), in step order, until the step retires
        self._copied: deque[tuple[int, list[Any]]] = deque()
        # the most ring copies one step made
        self._ring_per_step = 1
        # recorded steps' values, until retired
        self.recorded: deque[tuple[int, list[Deferred]]] = deque()
        self.latest: dict[str, Any] = {}
        self.callbacks: list[OnComplete] = []
        # the parts' (see :meth:`listen`)
        self.listeners: list[OnComplete] = []
        # both, the parts' first: told in order (replaced, never changed in place)
        self.told: list[OnComplete] = []
        self._subscribed = False

    def defer(self, value: Any, name: str | None, copy: bool = False) -> Deferred:
        open_ = self.open
        if not open_ and copy is False and type(name) is str and self._subscribed:
            kind = type(value)
            off_cpu = _JAX_ARRAYS.get(kind)
            if off_cpu is not None:
                # the usual call: the step's first value, one named JAX array (the path below, with
                # nothing to check)
                if off_cpu:
                    value.copy_to_host_async()
                # (positional: a call with keywords costs more, once a step)
                deferred = Deferred(self.core.steps, name, value, self._wait, False, [value])
                open_.append(deferred)
                return deferred
            torch = sys.modules.get("torch")
            if torch is not None and kind is torch.Tensor:
                # the other usual call: one named torch tensor (the path below, without the walk)
                # (core.synchronous, without the property's call)
                host, ringed = tensor_snapshot(value, self.core.new_event is None, self)
                deferred = Deferred(self.core.steps, name, host, self._wait, False, None, ringed)
                open_.append(deferred)
                return deferred
        if name is not None and not isinstance(name, str):
            raise TypeError(f"defer() name must be a str or None, got {name!r}")
        if not self._subscribed:
            self._subscribe()
        unnamed = name is None
        open_ = self.open
        taken = {deferred.name for deferred in open_} if open_ else ()
        # "value", then "value_1", ...: the first default name no value of the step has
        if name is None:
            k = sum(1 for deferred in open_ if deferred.unnamed)
            name = "value" if not k else f"value_{k}"
            while name in taken:
                k += 1
                name = f"value_{k}"
        elif name in taken and any(deferred.unnamed and deferred.name == name
                                   for deferred in open_):
            raise ValueError(
                f"defer(name={name!r}): an unnamed value of this step already has the default name "
                f"{name!r}; name that value too, or pick another name"
            )
        if copy is not False and copy is not True:
            raise TypeError(f"defer() copy must be True or False, got {copy!r}")
        off_cpu = _JAX_ARRAYS.get(type(value))
        if off_cpu is not None and not copy:
            # the usual value, one JAX array: Snapshot._jax without the walk
            if off_cpu:
                value.copy_to_host_async()
            deferred = Deferred(self.core.steps, name, value, self._wait, unnamed=unnamed,
                                held=[value])
        else:
            copier = Snapshot(self.core.new_event is None, copy, self)
            host = _map(value, copier)
            deferred = Deferred(self.core.steps, name, host, self._wait, unnamed=unnamed,
                                held=copier.held or None, ringed=copier.ringed)
        open_.append(deferred)
        return deferred

    def _ring_copy(self, tensor: Any, kind: str) -> Any:
        """Enqueue ``tensor``'s copy into a ring slot on the current stream; None: torch pins it (no
        free slot, or a layout a flat slot cannot hold). ``kind``: its device type, ``"cuda"`` or
        ``"xpu"``."""
        ring, model = self.ring, self.model
        if ring is None:
            # here, not at the top: prefetch imports this module
            from .backends.snapshots import TorchSnapshots
            from .parts.prefetch import PinnedRing

            self.model = model = TorchSnapshots(kind)
            self.ring = ring = PinnedRing(model, self._ring_limit)  # type: ignore[arg-type]  # pin and event only
        elif kind != model.kind:
            raise ValueError(
                f"defer() got a tensor on {kind}, but this throttle's deferred tensors are on "
                f"{model.kind}: the step's event cannot be ordered after a copy on another kind of "
                f"device; defer its .cpu() copy, or use one throttle per device type")
        # (get_device() makes no torch.device: a CUDA tensor's index)
        key = model.stream_key(tensor.get_device())
        keys = self.stream_keys
        if key not in keys:
            keys.append(key)
        if tensor.layout is not sys.modules["torch"].strided or tensor.is_nested:
            # sparse and nested tensors have no flat bytes to view (nbytes raises for sparse ones):
            # torch's own copy, on the same stream
            return None
        self._ring_leaves += 1
        nbytes = tensor.nbytes
        slot = ring.take(self.core.steps, nbytes)
        if slot.buffer is None:
            return None
        # a step defers the same tensors as the step before: the slot keeps its views (three
        # torch calls, 6.6 us on the host, made once per slot and kind of tensor)
        form = (tensor.dtype, tensor.shape)
        views = slot.views
        host = views.get(form)
        if host is None:
            host = slot.buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
            if len(views) < 8:
                views[form] = host
        model.copy(host, tensor)
        return host

    def _ring_limit(self) -> int:
        depth = self.core.depth
        return ((UNBOUNDED_STEPS if depth is None else depth) + 2) * self._ring_per_step

    def add(self, callback: OnComplete) -> None:
        if not callable(callback):
            raise TypeError(f"on_complete needs a callable(step, values), got {callback!r}")
        self._subscribe()
        # copied on write: a delivery goes on over the old list
        self.callbacks = [*self.callbacks, callback]
        self.told = [*self.listeners, *self.callbacks]

    def listen(self, listener: OnComplete) -> None:
        """A part hears ``listener(step, values)`` for every step, before the ``on_complete``
        callbacks.

        It does not subscribe to the core: a throttle that defers nothing has nothing to tell it.
        """
        self.listeners = [*self.listeners, listener]
        self.told = [*self.listeners, *self.callbacks]

    def remove(self, callback: OnComplete) -> None:
        try:
            callbacks = list(self.callbacks)
            callbacks.remove(callback)
            self.callbacks = callbacks
            self.told = [*self.listeners, *callbacks]
        except ValueError:
            raise ValueError(f"{callback!r} is not registered with on_complete(); nothing to "
                             "remove") from None

    def on_drop(self, step: int) -> None:
        """The current step ended without an event: its values will never arrive (``get()`` says
        so)."""
        for deferred in self.open:
            deferred._dropped = True
        # (stream_keys are kept: the copies were enqueued and write into their ring slots, which
        # are taken again only after the step of that number retires; the next recorded step's
        # event joins their streams, so that retirement comes after them)
        self.open, self._ring_leaves = [], 0

    # -- the core's notifications -----------------------------------------------

    def before_record(self, step: int, event: Event) -> None:
        """Order the step's event after the copies enqueued on other CUDA or XPU streams (no
        ``Stream`` made otherwise); give a JAX event the step's held arrays to wait on
        (``cover``)."""
        values = self.open
        arrays: list[Any] | None
        if len(values) == 1:
            # the usual step: one value (its list is read, never changed, by cover())
            arrays = values[0]._held
        else:
            arrays = []
            # (a loop, not a comprehension: 3.11 makes a comprehension a call)
            for deferred in values:
                held = deferred._held
                if held:
                    arrays += held
        if arrays:
            cover = getattr(event, "cover", None)
            if cover is not None:
                cover(arrays)
        keys = self.stream_keys
        if not keys:
            return
        # (kept until on_record: a record that fails, as under CUDA graph capture, drops the step,
        # and the next step's event must cover these copies instead; see on_drop)
        model = self.model
        join = getattr(event, "wait_stream", None)
        if join is None:
            self._finish_unordered(step, event, keys)
            return
        # The key of the stream the event records on: a copy enqueued there is ordered before it
        # already. That is the current stream of the event's device, not of the tensor's: a tensor
        # on another GPU is copied on that GPU's stream, which the event must join.
        index = (getattr(event, "device_index", None)
                 if getattr(event, "records_on_current", False) else None)
        here = model.stream_key(index()) if index is not None else None
        for key in keys:
            if key != here:
                join(model.stream(key))

    def _finish_unordered(self, step: int, event: Event, keys: list[Any]) -> None:
        """Order the step's values after the copies that ``event``, which cannot join a stream (no
        ``wait_stream``: JAX's events, most custom ``events=``), does not cover: an event is
        recorded on each such stream, after them, and the values wait for it when they are read
        (never blocks here). A bare ``torch.cuda.Event`` covers the copies on the stream it
        records on, the current device's current stream."""
        model = self.model
        here = (model.stream_key(model.current_device()) if model.bare_event(event)
                else None)
        markers = []
        for key in keys:
            if key == here:
                continue
            if not self._unordered:
                self._unordered = True
                _log.warning(
                    "asyncthrottle: a deferred tensor was copied on a stream the throttle's events "
                    "cannot be ordered after (%r has no wait_stream(stream)), so an event is "
                    "recorded there each step and its values wait for it when read; defer on the "
                    "current stream, use the tensor's device as the throttle's, or give the "
                    "events a wait_stream method", type(event))
            # recorded after the copies enqueued there so far; never blocks
            markers.append(model.marker(key))
        if markers:
            for deferred in self.open:
                deferred._copied = markers
            # (also for a step with no value: a failed step's copies, covered here, write into
            # ring slots taken again once this step retires)
            self._copied.append((step, markers))

    def _release_copies(self, step: int) -> None:
        """Wait for the copies that steps up to ``step`` made on streams their events could not
        join; their events go back to the model."""
        copied, model = self._copied, self.model
        while copied and copied[0][0] <= step:
            markers = copied.popleft()[1]
            for marker in markers:
                # host-device sync: see _finish_unordered; the step itself is complete
                marker.synchronize()
            model.release(markers)
            # (the step's values share the list: they have nothing left to wait for)
            markers.clear()

    def on_record(self, step: int, event: Event | None, now: float) -> None:
        values = self.open
        if self.stream_keys:
            # the step's event covers them now
            self.stream_keys = []
        holding = self.holding
        if values:
            self.open = []
            done = event is None
            for deferred in values:
                # Deferred._recorded, inlined: the per-step path
                deferred._event, deferred._done = event, done
                if deferred._held:
                    holding.append(deferred)
            # (a step with no value has no entry: its retirement delivers an empty dict)
            self.recorded.append((step, values))
        if self._ring_leaves:
            self._ring_per_step = max(self._ring_per_step, self._ring_leaves)
            self._ring_leaves = 0
        # a donation in this step's body is seen here: one is_deleted() an array (0.05 us)
        for deferred in holding:
            # (read once: a get() of a complete step, from any thread, settles it and lets its
            # arrays go before the step retires)
            held = deferred._held
            if held and deferred._lost is None:
                for array in held:
                    if array.is_deleted():
                        deferred._donated(step)
                        break

    def on_retire(self, step: int) -> None:
        """``step`` is complete: its values go to ``latest`` and the callbacks. Never blocks."""
        recorded = self.recorded
        deferreds = recorded.popleft()[1] if recorded and recorded[0][0] == step else ()
        if not deferreds and recorded and recorded[0][0] < step:
            # steps retired but never told here (Ctrl-C between a retirement and its telling):
            # theirs first, in order
            while recorded and recorded[0][0] < step:
                self.on_retire(recorded[0][0])
            deferreds = recorded.popleft()[1] if recorded and recorded[0][0] == step else ()
        holding = self.holding
        while holding and holding[0].step <= step:
            holding.popleft()
        if self._copied:
            # before the settles read the slots those copies write
            self._release_copies(step)
        lost: DonatedValueError | None = None
        values: dict[str, Any] = {}
        # names deferred more than once in the step: their value is the list of them
        repeated: set[str] | None = None
        for deferred in deferreds:
            deferred._done = True
            # a value kept by the user does not keep its step's event from reuse
            deferred._event = None
            if deferred._lost is None:
                try:
                    # the step is complete: no wait
                    value = deferred._settle()
                except RuntimeError:
                    # a JAX array donated since the last record raises here (one call an array
                    # fewer than asking first)
                    if not deferred._donated(None):
                        raise
                else:
                    name = deferred.name
                    if name not in values:
                        values[name] = value
                    elif repeated is not None and name in repeated:
                        values[name].append(value)
                    else:
                        values[name] = [values[name], value]
                        repeated = {name} if repeated is None else repeated | {name}
                    continue
            # raised once the step's other values are delivered
            lost = lost or deferred._lost
        if self.ring is not None:
            # after the settles: their values were copied out of the slots
            self.ring.retire(step)
        self.latest.update(values)
        # every callback sees every step (the core's rule: see tell_rest); the first error is
        # raised after
        told = self.told
        try:
            for callback in told:
                callback(step, values)
        except BaseException as exc:
            tell_rest(told, callback, step, values)
            if lost is None or not isinstance(exc, Exception):
                raise
        if lost is not None:
            raise lost._fresh()

    def _subscribe(self) -> None:
        if not self._subscribed:
            self._subscribed = True
            self.core.subscribe(self)

