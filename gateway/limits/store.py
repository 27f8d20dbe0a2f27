"""The one interface every limit store implements, and the values it trades in.

Algorithm: a sliding-window log per scope (a tenant, one API key, one route).
Every admitted request leaves one entry `(admitted_at, tokens)` in its scope's
window; entries older than `WINDOW_S` drop out. A request is admitted when, in
*every* scope it touches, `entries + 1 <= requests_per_minute` and
`tokens_in_window + estimate <= tokens_per_minute`; only then is an entry added
to each scope (all or nothing). That is exact: in any 60 s interval a scope
never holds more than its limit, so "100 per minute, 300 concurrent requests"
admits exactly 100 whatever the arrival pattern, where a token bucket would
also admit whatever refilled while the burst was arriving, and a fixed window
would admit 200 across a minute boundary. The cost is memory proportional to
admitted requests per minute (bounded by the limit itself) and O(1) amortised
work per admission (each entry is added once and expired once).

One entry carries both the request and its token estimate, so RPM and TPM are
checked against the same log. Settlement rewrites the entry's tokens in place
(refund or extra charge) while it is still in the window; an extra charge that
arrives after its entry aged out is added as a new entry at settlement time.

Stores never read a clock: `now` (seconds since the epoch, float) is passed in,
so the behaviour is deterministic under test and identical across stores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

WINDOW_S = 60.0

LimitKind = Literal["requests", "tokens", "budget_day", "budget_month"]
StoreName = Literal["memory", "redis", "fallback"]


class StoreUnavailable(Exception):
    """The shared store could not answer in time (Redis down, timeout, loading)."""


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
    """A scope's window right after the decision (what the headers report)."""

    scope: Scope
    requests: int  # entries in the window
    tokens: int  # tokens charged in the window
    oldest_at: float | None  # admission time of the oldest live entry


@dataclass(slots=True)
class Reservation:
    """What `settle` needs to reconcile one admitted request."""

    id: str
    tenant: str
    scopes: tuple[Scope, ...]
    tokens: int  # the estimate reserved at admission
    admitted_at: float
    store: StoreName  # which store holds the entries (fail-open may use the fallback)
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
