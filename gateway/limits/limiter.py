"""The limiter the request pipeline calls: policy → scopes → store → headers or a 429.

    ticket = await limiter.admit(policy, tenant, key_hash=..., route=..., tokens=estimate)
    ... response.headers.update(ticket.headers); features get ticket.remaining_budget_micros
    await limiter.settle(ticket, actual_tokens=..., charge=Charge(...))   # in a `finally`

`admit` raises `RequestsLimitExceeded` / `TokensLimitExceeded` / `BudgetExceeded`
(429, OpenAI-shaped, with `Retry-After` and the `x-ratelimit-*` headers) or
`LimitStoreUnavailable` (503, only with `on_store_error: fail_closed`).
`settle` is idempotent, so a stream cancelled midway settles once with what it
produced. A request cancelled while Redis decides holds no tokens either: the Redis
store lets the admission finish and releases what it reserved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from random import getrandbits
from typing import Any

from gateway.core.errors import GatewayError, RateLimited
from gateway.limits.headers import (
    go_duration,
    rate_limit_headers,
    rate_limit_message,
    retry_headers,
)
from gateway.limits.ledger import (
    MICROS_PER_USD,
    budget_micros,
    periods_at,
    remaining_budget_micros,
)
from gateway.limits.store import (
    WINDOW_S,
    BudgetLimits,
    Charge,
    LimitStore,
    Rejection,
    Reservation,
    Scope,
    StoreUnavailable,
)
from policies.load import Policy


class RequestsLimitExceeded(RateLimited):
    type = "requests"  # OpenAI's 429 says which limit in `type`
    rejected_limit = "rpm"


class TokensLimitExceeded(RateLimited):
    type = "tokens"
    rejected_limit = "tpm"


class BudgetExceeded(RateLimited):
    code = "budget_exceeded"
    type = "insufficient_quota"  # what OpenAI calls an exhausted spend allowance
    retryable = False
    rejection = rejected_limit = "budget"


class LimitStoreUnavailable(GatewayError):
    status = 503
    code = "rate_limit_store_unavailable"
    type = "server_error"
    retryable = True
    log_each = False  # the failover store reports the outage, with a count, per interval


@dataclass(slots=True)
class Ticket:
    """An admitted request: headers for its response, what routing may spend."""

    reservation: Reservation
    headers: dict[str, str]
    remaining_budget_micros: int | None  # None: no budget configured
    settled: bool = field(default=False)


def _usd(micros: int) -> str:
    """Cents when that is exact, else as many decimals as the micro-dollars need."""
    if micros % 10_000 == 0:
        return f"${micros / MICROS_PER_USD:,.2f}"
    return f"${micros / MICROS_PER_USD:,.6f}".rstrip("0")


# Entries kept per policy version by `Limiter._limits_for`; their keys come from the
# policy (tenants, key hashes, routes), so this only bounds a pathological policy.
LIMITS_CACHE_ENTRIES = 4096


def _reservation_id() -> str:
    """128 random bits as hex: unique like a uuid4. `random`, not `os.urandom`: an id
    needs no secrecy, and no system call (the module reseeds itself in a forked child,
    so replicas forked from one parent still draw different ids)."""
    return f"{getrandbits(128):032x}"


class Limiter:
    def __init__(self, store: LimitStore, *, clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] = _reservation_id) -> None:
        self.store = store
        self._clock = clock
        self._new_id = new_id
        # (tenant, key hash, route) → (scopes, budget), for `_limits_policy` only: both
        # derive from the policy alone, so a reload (a new Policy object) starts afresh.
        self._limits_policy: Policy | None = None
        self._limits: dict[tuple[str, str | None, str | None],
                           tuple[tuple[Scope, ...], BudgetLimits]] = {}

    def _limits_for(self, policy: Policy, tenant: str, key_hash: str | None,
                    route: str | None) -> tuple[tuple[Scope, ...], BudgetLimits]:
        """`scopes_for` and `budget_for`, computed once per policy version (~8 µs a
        request otherwise: pydantic attribute walks, f-strings and dataclass inits)."""
        if policy is not self._limits_policy:
            self._limits_policy, self._limits = policy, {}
        key = (tenant, key_hash, route)
        found = self._limits.get(key)
        if found is None:
            if len(self._limits) >= LIMITS_CACHE_ENTRIES:
                self._limits.clear()
            found = self._limits[key] = (self.scopes_for(policy, tenant, key_hash, route),
                                         self.budget_for(policy, tenant))
        return found

    @staticmethod
    def scopes_for(policy: Policy, tenant: str, key_hash: str | None = None,
                   route: str | None = None) -> tuple[Scope, ...]:
        """The windows one request counts against: tenant, then API key and route if limited."""
        spec = policy.file.tenants.get(tenant)
        limits = (spec.limits if spec is not None and spec.limits is not None
                  else policy.file.defaults.limits)
        scopes = [Scope("tenant", limits.requests_per_minute, limits.tokens_per_minute)]
        if spec is not None and spec.key_limits is not None and key_hash:
            key_limits = spec.key_limits
            scopes.append(Scope(f"key:{key_hash.removeprefix('sha256:')[:16]}",
                                key_limits.requests_per_minute, key_limits.tokens_per_minute))
        route_spec = policy.routes.get(route) if route else None
        route_limits = route_spec.limits if route_spec is not None else None
        if route_limits is not None:
            scopes.append(Scope(f"route:{route}", route_limits.requests_per_minute,
                                route_limits.tokens_per_minute))
        return tuple(scopes)

    @staticmethod
    def budget_for(policy: Policy, tenant: str) -> BudgetLimits:
        spec = policy.file.tenants.get(tenant)
        if spec is None:
            return BudgetLimits()
        day, month = budget_micros(spec.budget)
        return BudgetLimits(day, month)

    async def admit(self, policy: Policy, tenant: str, *, tokens: int,
                    key_hash: str | None = None, route: str | None = None) -> Ticket:
        now = self._clock()
        scopes, budget = self._limits_for(policy, tenant, key_hash, route)
        try:
            decision = await self.store.admit(tenant, scopes, tokens, budget, now, self._new_id())
        except StoreUnavailable as exc:
            raise LimitStoreUnavailable(
                "Rate limits cannot be checked right now (the limit store is unavailable); "
                "retry shortly.", headers=retry_headers(1.0)) from exc
        headers = rate_limit_headers(decision.states)
        if decision.rejection is not None:
            raise self._rejected(decision.rejection, tenant, budget, headers, now)
        assert decision.reservation is not None
        remaining = remaining_budget_micros(budget.day_micros, budget.month_micros,
                                            decision.spent_day_micros,
                                            decision.spent_month_micros)
        return Ticket(decision.reservation, headers, remaining)

    async def settle(self, ticket: Ticket, *, actual_tokens: int,
                     charge: Charge | None = None) -> None:
        """Charge what the request really used (once; later calls do nothing)."""
        if ticket.settled:
            return
        ticket.settled = True
        await self.store.settle(ticket.reservation, actual_tokens if actual_tokens > 0 else 0,
                                charge or Charge(), self._clock())

    async def usage(self, policy: Policy, tenant: str) -> dict[str, Any]:
        """Requests, tokens and spend this day and month (`GET /admin/usage`)."""
        now = self._clock()
        report = await self.store.usage(tenant, now)
        periods = periods_at(now)
        budget = self.budget_for(policy, tenant)
        out: dict[str, Any] = {"tenant": tenant, "store": self.store.name}
        for name, period, limit, resets_at in (
                ("day", report.day, budget.day_micros, periods.day_resets_at),
                ("month", report.month, budget.month_micros, periods.month_resets_at)):
            out[name] = {
                "period": period.period,
                "requests": period.requests,
                "input_tokens": period.input_tokens,
                "output_tokens": period.output_tokens,
                "total_tokens": period.input_tokens + period.output_tokens,
                "spend_micros": period.spend_micros,
                "spend_usd": period.spend_micros / MICROS_PER_USD,
                "budget_micros": limit,
                "remaining_micros": None if limit is None else max(0, limit - period.spend_micros),
                "resets_at": _iso(resets_at),
            }
        return out

    async def aclose(self) -> None:
        await self.store.aclose()

    def _rejected(self, rejection: Rejection, tenant: str, budget: BudgetLimits,
                  headers: dict[str, str], now: float) -> GatewayError:
        if rejection.kind in ("budget_day", "budget_month"):
            periods = periods_at(now)
            daily = rejection.kind == "budget_day"
            resets_at = periods.day_resets_at if daily else periods.month_resets_at
            wait = resets_at - now
            message = (f"Budget exceeded for tenant {tenant}: the {'daily' if daily else 'monthly'}"
                       f" budget of {_usd(rejection.limit)} is spent ({_usd(rejection.used)})."
                       f" It resets at {_iso(resets_at)} (in {go_duration(wait)}).")
            return BudgetExceeded(message, headers={**headers, **retry_headers(
                wait, should_retry=False)})
        fits = rejection.retry_after_s is not None
        retry = retry_headers(WINDOW_S if rejection.retry_after_s is None
                              else rejection.retry_after_s, should_retry=fits)
        subject = tenant if rejection.scope is None or rejection.scope.key == "tenant" \
            else f"{tenant} ({rejection.scope.key})"
        error_type = RequestsLimitExceeded if rejection.kind == "requests" else TokensLimitExceeded
        return error_type(rate_limit_message(rejection, subject), headers={**headers, **retry})


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
