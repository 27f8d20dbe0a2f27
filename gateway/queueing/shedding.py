"""Admission at the door of a full backend: how long the wait would be, who may wait, who is shed.

Rules, cheapest first:
1. A request whose predicted wait alone would break its remaining budget is
   refused at once (the gateway then tries routing's next candidate). The
   prediction counts the waiters ahead of it *and* the share of the backend that
   higher bands will take while it waits (they overtake it), so a normal request
   admitted under a stream of high-priority traffic is not left to expire.
2. Each priority may fill only its share of the queue; `low` gets half and
   `batch` (the Batch API's lines) a quarter by default, so that a burst of
   background traffic leaves room for interactive work.
3. When the share is used up, a more urgent arrival evicts the newest waiter of
   the lowest band below it (the one that has invested least in waiting);
   otherwise the arrival itself is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from gateway.queueing.fair_share import FairBand, Waiter
from policies.bands import PRIORITIES, Priority

DEFAULT_MAX_WAITING = 256
# Time constant of the arrival-rate estimate per band: about the budgets it
# protects (seconds), so a burst of high-priority traffic counts while it lasts.
RATE_WINDOW_S = 2.0
RATE_MIN_SPAN_S = 1.0  # a younger estimate is read as if it had seen this long
# Above this utilisation by higher bands a lower one is predicted never to be
# served; the figure stands in for "forever" in messages and Retry-After.
SATURATED_SHARE = 0.02
MAX_PREDICTED_WAIT_S = 3600.0
ADMISSION_Z = 1.65
DEFAULT_SHARES: Mapping[Priority, float] = MappingProxyType(
    {"high": 1.0, "normal": 1.0, "low": 0.5, "batch": 0.25})


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


class ArrivalRate:
    """Requests per second joining one band, exponentially decayed over `window_s`.

    For Poisson arrivals at rate r the decayed count settles at r · window_s; until
    then it is divided by the part of the window it has seen, so a fresh estimate
    is not biased low (the same correction as Adam's moment estimates).
    """

    __slots__ = ("_at", "_level", "_since", "window_s")

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._level = 0.0
        self._at = 0.0
        self._since: float | None = None

    def add(self, now: float) -> None:
        self._level = self._decayed(now) + 1.0
        self._at = now
        if self._since is None:
            self._since = now

    def per_s(self, now: float) -> float:
        if self._since is None:
            return 0.0
        span = max(RATE_MIN_SPAN_S, now - self._since)
        return self._decayed(now) / (self.window_s * -math.expm1(-span / self.window_s))

    def _decayed(self, now: float) -> float:
        since_s = now - self._at
        return self._level * math.exp(-since_s / self.window_s) if since_s > 0.0 else self._level


class WaitEstimate(NamedTuple):
    mean_s: float
    releases: int  # slot releases the newcomer needs before it is served

    @property
    def likely_max_s(self) -> float:
        """The wait that ~95 % of newcomers stay under (one-sided, z = 1.65).

        Releases seen by one band arrive roughly as a Poisson stream (higher bands
        overtake at random), so the wait for n of them has a spread of
        mean / sqrt(n). Admitting on the mean alone would let about half of the
        requests admitted near the limit expire in the queue, after waiting.
        """
        if self.releases <= 0:
            return 0.0
        return min(MAX_PREDICTED_WAIT_S,
                   self.mean_s * (1.0 + ADMISSION_Z / math.sqrt(self.releases)))


def estimate_wait(*, limit: int | None, in_flight: int, ahead: int,
                  mean_service_s: float, higher_load: float = 0.0) -> WaitEstimate:
    """Expected time until a newcomer behind `ahead` waiters gets one of `limit` slots.

    Slots free up at `limit / mean_service_s` per second on average, and the
    newcomer needs `ahead + 1` of them beyond those already free. `higher_load`
    is the fraction of the backend that later, higher-priority arrivals take
    (their rate × mean service time / limit): only the rest serves this band.
    """
    if limit is None:
        return WaitEstimate(0.0, 0)
    releases = ahead + 1 - max(0, limit - in_flight)
    if releases <= 0:
        return WaitEstimate(0.0, 0)
    share = 1.0 - higher_load
    if share <= SATURATED_SHARE:
        return WaitEstimate(MAX_PREDICTED_WAIT_S, releases)
    return WaitEstimate(min(MAX_PREDICTED_WAIT_S, releases * mean_service_s / limit / share),
                        releases)


def choose_victim(bands: Mapping[Priority, FairBand], arriving: Priority) -> Waiter | None:
    """The newest waiter of the lowest band strictly below `arriving`, or None."""
    rank = PRIORITIES.index(arriving)
    for priority in reversed(PRIORITIES[rank + 1:]):
        victim = bands[priority].newest()
        if victim is not None:
            return victim
    return None
