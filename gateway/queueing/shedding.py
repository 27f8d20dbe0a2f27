"""Admission at the door of a full backend: how long the wait would be, who may wait, who is shed.

Rules, cheapest first:
1. A request whose predicted wait alone would break its remaining budget is
   refused at once (the gateway then tries routing's next candidate).
2. Each priority may fill only its share of the queue; `low` gets half by
   default so that a burst of background traffic leaves room for interactive work.
3. When the share is used up, a more urgent arrival evicts the newest waiter of
   the lowest band below it (the one that has invested least in waiting);
   otherwise the arrival itself is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.queueing.fair_share import PRIORITIES, FairBand, Priority, Waiter

DEFAULT_MAX_WAITING = 256
DEFAULT_SHARES: Mapping[Priority, float] = MappingProxyType(
    {"high": 1.0, "normal": 1.0, "low": 0.5})


@dataclass(frozen=True, slots=True)
class ShedPolicy:
    """Bounds of one backend's queue.

    Memory is bounded with the length: a waiter is a small record and a future
    (well under 1 KiB); request bodies stay with their handlers.
    """

    max_waiting: int = DEFAULT_MAX_WAITING
    shares: Mapping[Priority, float] = field(default_factory=lambda: DEFAULT_SHARES)

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        for priority in PRIORITIES:
            if not 0.0 <= self.shares.get(priority, 1.0) <= 1.0:
                raise ValueError(f"share for {priority!r} must be within [0, 1]")

    def cap(self, priority: Priority) -> int:
        """How many waiters (of any band) may already be queued for this priority to join."""
        return math.floor(self.max_waiting * self.shares.get(priority, 1.0))


def predicted_wait_s(*, limit: int | None, in_flight: int, ahead: int,
                     mean_service_s: float) -> float:
    """Expected time until a newcomer behind `ahead` waiters gets one of `limit` slots.

    Slots free up at `limit / mean_service_s` per second on average, and the
    newcomer needs `ahead + 1` of them beyond those already free.
    """
    if limit is None:
        return 0.0
    releases_needed = ahead + 1 - max(0, limit - in_flight)
    if releases_needed <= 0:
        return 0.0
    return releases_needed * mean_service_s / limit


def choose_victim(bands: Mapping[Priority, FairBand], arriving: Priority) -> Waiter | None:
    """The newest waiter of the lowest band strictly below `arriving`, or None."""
    rank = PRIORITIES.index(arriving)
    for priority in reversed(PRIORITIES[rank + 1:]):
        victim = bands[priority].newest()
        if victim is not None:
            return victim
    return None
