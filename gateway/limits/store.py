"""The one interface every limit store implements, and the values it trades in.

Algorithm: a sliding-window counter per scope (a tenant, one API key, one route),
in `window_counter.py`: five integers a scope, whatever its traffic. A request is
admitted when it fits *every* scope it touches, for requests and for its token
estimate; only then is it counted in each scope (all or nothing). From a fresh scope
"100 per minute" admits exactly 100 however the burst arrives; afterwards any 60 s
admits fewer than twice the limit, and any τ ≤ 60 s fewer than L + L·τ/60 s.

Settlement reconciles the estimate with the actual usage: a refund comes off the
window that counted the reservation while it still weighs, and usage beyond the
estimate is charged to the current window when it becomes known.

Stores never read a clock: `now` (seconds since the epoch, float) is passed in,
so the behaviour is deterministic under test and identical across stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

WINDOW_S = 60.0  # one window of the counter; limits are per minute

LimitKind = Literal["requests", "tokens", "budget_day", "budget_month"]
StoreName = Literal["memory", "redis", "fallback"]


class StoreUnavailable(Exception):
    """The shared store could not answer in time (Redis down, timeout, loading)."""

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow  # it did not answer in time, rather than not at all


@dataclass(frozen=True, slots=True)
class Scope:
    """One window of limits; `key` is unique within its tenant."""

    key: str  # "tenant", "key:<hash prefix>", "route:<name>"
    requests_per_minute: int | None
    tokens_per_minute: int | None


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """A tenant's spend ceilings in integer micro-dollars (None: no ceiling)."""

    day_micros: int | None = None
    month_micros: int | None = None


NO_BUDGET = BudgetLimits()


# Made per request: not frozen (a frozen dataclass costs ~3x to build); read-only
# by convention.
@dataclass(slots=True)
class ScopeState:
    """A scope right after the decision (what the headers report)."""

    scope: Scope
    requests: int  # counted now: the current window's, and the previous one's share
    tokens: int
    # what they were counted from, for when capacity next returns (`window_counter`)
    elapsed_ms: int  # into the current window
    previous_requests: int
    current_requests: int
    previous_tokens: int
    current_tokens: int


@dataclass(slots=True)
class Reservation:
    """What `settle` needs to reconcile one admitted request."""

    id: str
    tenant: str
    scopes: tuple[Scope, ...]
    tokens: int  # the estimate reserved at admission
    admitted_at: float
    store: StoreName  # which store counted it (fail-open may use the fallback)
    # per scope, the start (epoch ms) of the window that counted it; None where the
    # store's reply was lost: its admission time then says which window that was
    windows_ms: tuple[int, ...] | None = None
    handle: object = field(default=None, compare=False, repr=False)  # the store's own


@dataclass(frozen=True, slots=True)
class Rejection:
    kind: LimitKind
    scope: Scope | None  # None for budgets
    limit: int  # requests, tokens or micro-dollars
    used: int
    requested: int
    retry_after_s: float | None  # None: never fits (a request larger than the limit)


@dataclass(slots=True)
class Decision:
    reservation: Reservation | None  # set when admitted
    rejection: Rejection | None  # set when rejected
    states: tuple[ScopeState, ...]
    spent_day_micros: int = 0
    spent_month_micros: int = 0

    @property
    def admitted(self) -> bool:
        return self.reservation is not None


@dataclass(slots=True)
class Charge:
    """Actual usage of one settled request, for the spend ledger."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    # no backend answered it: the request leaves the windows too (as its tokens do)
    refund_request: bool = False


@dataclass(slots=True)
class PeriodUsage:
    period: str  # "2026-11-29" or "2026-11"
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    spend_micros: int = 0


@dataclass(slots=True)
class TenantUsage:
    tenant: str
    day: PeriodUsage
    month: PeriodUsage
    extra: dict[str, str] = field(default_factory=dict)


class LimitStore(Protocol):
    """Memory, Redis and the fail-open wrapper all answer these four calls."""

    name: StoreName

    async def admit(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                    budget: BudgetLimits, now: float, request_id: str) -> Decision:
        """Check every scope and the budget, and reserve in all of them or none."""
        ...

    async def settle(self, reservation: Reservation, actual_tokens: int, charge: Charge,
                     now: float) -> None:
        """Replace the reserved estimate with `actual_tokens`; add `charge` to the ledger."""
        ...

    async def usage(self, tenant: str, now: float) -> TenantUsage:
        ...

    async def aclose(self) -> None:
        ...
