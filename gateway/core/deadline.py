"""A request's deadline, end to end: when its answer stops being useful to the client.

The route's `latency_budget` (tightened by `x-routegate-ttft-budget-ms` /
`x-routegate-total-budget-ms`) fixes two instants from the request's arrival:

    first_token_at   the first token must have arrived (TTFT budget; never after end_at)
    end_at           the whole answer must have arrived (total budget)

Every attempt is bounded by them: its connect and first-byte timeouts are the smaller
of the backend's and what is left until `first_token_at`, its total timeout the
smaller of the backend's and what is left until `end_at`. A fallback whose predicted
TTFT (or total) no longer fits what is left is skipped, and the remaining budget
travels to the backend in `x-routegate-deadline-ms` so it can drop work nobody waits
for. Instants are seconds on the request's timing clock (`RequestTimings.clock`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from policies.load import Policy
from policies.schema import Timeouts as BackendTimeouts
from routing.features import (
    TOTAL_BUDGET_HEADER,
    TTFT_BUDGET_HEADER,
    FeatureError,
    route_for,
    tightened,
)

DEADLINE_HEADER = "x-routegate-deadline-ms"  # ms left of the total budget, to the backend
TIMER_SLACK_S = 0.001  # how early an event loop timer may fire


class Timeouts(NamedTuple):
    connect_s: float
    first_byte_s: float
    total_s: float
    pool_wait_s: float = 10.0  # waiting for a free connection (within `total_s`)


@dataclass(frozen=True, slots=True)
class Deadline:
    first_token_at: float  # math.inf when the request has no budget
    end_at: float

    @classmethod
    def of(cls, start: float, ttft_ms: float | None,
           total_ms: float | None) -> Deadline | None:
        """From the arrival `start` and the budgets (ms); None when there are none."""
        if ttft_ms is None and total_ms is None:
            return None
        end_at = math.inf if total_ms is None else start + total_ms / 1000.0
        first_at = end_at if ttft_ms is None else min(end_at, start + ttft_ms / 1000.0)
        return cls(first_at, end_at)

    def passed(self, now: float) -> bool:
        return now >= self.first_token_at

    def cut_short(self, now: float) -> bool:
        """Whether a timeout at `now` is this deadline's (the first token was due by
        then) rather than the backend's own, shorter one. Timers may fire a hair early."""
        return now >= self.first_token_at - TIMER_SLACK_S

    def left_ms(self, now: float) -> float:
        """Of the total budget (math.inf when only the TTFT is bounded)."""
        return (self.end_at - now) * 1000.0

    def misfit(self, now: float, ttft_ms: float, total_ms: float) -> str | None:
        """Why a candidate predicted at `ttft_ms` / `total_ms` no longer fits, or None."""
        first_left_ms = (self.first_token_at - now) * 1000.0
        if ttft_ms > first_left_ms:
            return f"predicted TTFT {ttft_ms:.0f} ms > {max(first_left_ms, 0):.0f} ms left"
        left_ms = self.left_ms(now)
        if total_ms > left_ms:
            return f"predicted total {total_ms:.0f} ms > {max(left_ms, 0):.0f} ms left"
        return None

    def attempt_timeouts(self, own: BackendTimeouts, now: float) -> Timeouts:
        """The backend's timeouts, each cut to what is left of the budget it bounds."""
        first_left_s = max(self.first_token_at - now, 0.001)
        total_left_s = max(self.end_at - now, 0.001)
        return Timeouts(min(own.connect_s, first_left_s), min(own.first_byte_s, first_left_s),
                        min(own.total_s, total_left_s))

    def header_value(self, now: float) -> str | None:
        """`x-routegate-deadline-ms`: whole ms left of the total budget; None when unbounded."""
        if self.end_at == math.inf:
            return None
        return str(max(0, math.floor(self.left_ms(now))))


def budgets_ms(policy: Policy, served: str | None,
               headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """(TTFT, total) budget of the route `served`, tightened by the request's headers. A
    malformed header is routing's to report (400): here it leaves the route's budget."""
    if served is None:
        return None, None
    try:
        budget = route_for(policy, served).latency_budget
    except FeatureError:
        return None, None
    ttft_ms, total_ms = budget.ttft_ms, budget.total_ms
    with contextlib.suppress(FeatureError):
        ttft_ms = tightened(ttft_ms, headers.get(TTFT_BUDGET_HEADER), TTFT_BUDGET_HEADER)
    with contextlib.suppress(FeatureError):
        total_ms = tightened(total_ms, headers.get(TOTAL_BUDGET_HEADER), TOTAL_BUDGET_HEADER)
    return ttft_ms, total_ms
