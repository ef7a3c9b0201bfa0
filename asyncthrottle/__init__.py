"""asyncthrottle: bound how far the host runs ahead of an asynchronous device."""

from ._aliases import install as _install_aliases
from ._options import AutoDepth
from .core import Subscriber
from .core.errors import ThrottleTimeout
from .core.events import Event, EventFactory
from .core.waits import Block, Hybrid, Poll, Spin, SpinBlock, WaitStrategy
from .parts.memory import MemoryBudget
from .parts.nonfinite import NonFiniteError, NonFiniteWarning
from .parts.syncaudit import SyncAdvice
from .stats import Stats
from .testing.forbid import SyncError
from .throttle import Throttle, throttle
from .values import Deferred, DonatedValueError
from .view import Throttled

__all__ = [
    "AutoDepth",
    "Block",
    "Deferred",
    "DonatedValueError",
    "Event",
    "EventFactory",
    "Hybrid",
    "MemoryBudget",
    "NonFiniteError",
    "NonFiniteWarning",
    "Poll",
    "Spin",
    "SpinBlock",
    "Stats",
    "Subscriber",
    "SyncAdvice",
    "SyncError",
    "Throttle",
    "ThrottleTimeout",
    "Throttled",
    "WaitStrategy",
    "throttle",
]

__version__ = "0.3.0"

_install_aliases()
