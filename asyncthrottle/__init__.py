"""asyncthrottle: bound how far the host runs ahead of an asynchronous device."""

from .deferred import Deferred
from .errors import ThrottleTimeout
from .events import Event, EventFactory
from .stats import Stats
from .throttle import Throttle, throttle
from .view import Throttled
from .waits import Block, Hybrid, Poll, Spin, WaitStrategy

__all__ = [
    "Block",
    "Deferred",
    "Event",
    "EventFactory",
    "Hybrid",
    "Poll",
    "Spin",
    "Stats",
    "Throttle",
    "ThrottleTimeout",
    "Throttled",
    "WaitStrategy",
    "throttle",
]

__version__ = "0.1.0"
