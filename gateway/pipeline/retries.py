"""Retrying the same target: which failures, how long to wait, and the budget that bounds it.

A failure whose kind says "try again" (`UpstreamFailure.retryable`: a connect error, a
dropped connection, 503, 529, or 429 when it says when) may be retried on the same
target (`resilience.retries`):

    wait = max(full-jitter backoff, Retry-After)      backoff: uniform(0, base × 2^n)
    no retry when: the target had its `max_per_target`, the wait is longer than
                   `backoff_max_ms`, the request's first token would be due before the
                   wait is over, or the retry budget is spent

The budget is per process: retries may add at most `budget_percent` of the requests
seen in the last `budget_window_s` (at least `min_per_window`), counted in one-second
buckets. Everything else about a request — its rate limits, its ledger entry — counts it
once, however many attempts it took.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable

from gateway.core.deadline import Deadline
from gateway.core.failures import UpstreamFailure
from policies.resilience import Retries

BUCKET_S = 1.0


class RetryBudget:
    """Requests and retries of the last `window_s`, in one-second buckets."""

    def __init__(self) -> None:
        self._buckets: deque[list[float]] = deque()  # [bucket start, requests, retries]

    def _current(self, now: float, window_s: float) -> list[float]:
        buckets = self._buckets
        while buckets and buckets[0][0] <= now - window_s:
            buckets.popleft()
        start = now - now % BUCKET_S
        if not buckets or buckets[-1][0] != start:
            buckets.append([start, 0, 0])
        return buckets[-1]

    def requested(self, now: float, settings: Retries) -> None:
        self._current(now, settings.budget_window_s)[1] += 1

    def spend(self, now: float, settings: Retries) -> bool:
        """Take one retry from the budget, if it has one."""
        current = self._current(now, settings.budget_window_s)
        requests = sum(bucket[1] for bucket in self._buckets)
        retries = sum(bucket[2] for bucket in self._buckets)
        allowed = max(settings.min_per_window, requests * settings.budget_percent / 100.0)
        if retries + 1 > allowed:
            return False
        current[2] += 1
        return True

    def totals(self) -> tuple[int, int]:
        """(requests, retries) in the window, as last trimmed."""
        return (int(sum(bucket[1] for bucket in self._buckets)),
                int(sum(bucket[2] for bucket in self._buckets)))


class RetryPolicy:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 draw: Callable[[], float] = random.random) -> None:
        self.clock, self.draw = clock, draw
        self.budget = RetryBudget()

    def requested(self, settings: Retries) -> None:
        """A request reached its first attempt."""
        self.budget.requested(self.clock(), settings)

    def wait_s(self, failure: UpstreamFailure, retried: int, settings: Retries,
               deadline: Deadline | None, now: float) -> float | None:
        """Seconds to wait before retrying the target `failure` came from (`retried`
        times already), or None: no retry. `now` is on `deadline`'s clock."""
        if retried >= settings.max_per_target or not failure.retryable:
            return None
        advice_s = failure.retry_after_s
        if failure.needs_advice and advice_s is None:
            return None  # a rate limit without advice: another target, not a guess
        cap_s = settings.backoff_max_ms / 1000.0
        backoff_s = self.draw() * min(cap_s, settings.backoff_base_ms / 1000.0 * 2 ** retried)
        wait_s = max(backoff_s, advice_s or 0.0)
        if wait_s > cap_s:
            return None
        if deadline is not None and now + wait_s >= deadline.first_token_at:
            return None
        if not self.budget.spend(self.clock(), settings):
            return None
        return wait_s
