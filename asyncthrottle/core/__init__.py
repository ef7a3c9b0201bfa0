"""The depth rule: the queue of step events, its hooks, the events protocol, the waits and the
errors.

Nothing here imports anything outside ``asyncthrottle.core`` (no torch, no numpy).
"""

from .events import Event, EventFactory, MultiEvent
from .notify import EventSupplier, Subscriber
from .rule import Core

__all__ = ["Core", "Event", "EventFactory", "EventSupplier", "MultiEvent", "Subscriber"]
