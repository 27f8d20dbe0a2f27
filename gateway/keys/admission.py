"""Managed keys in the request path: a key's own routes, RPM/TPM and budgets, and the
spend ledger, around the limits' admission (`hooks.admission`).

A key's limits and its day and month budgets are counted by the same limit store as
tenants' — memory, or Redis with one script per admission — under a scope of its own
(`key:<id>`, as if it were a tenant), so they hold across replicas exactly as tenant
budgets do, in the same micro-dollars. Its lifetime budget is read from the spend
ledger (`spend.py`). The tenant is admitted first; a key refused after that gives its
tenant's reservation back (settled with nothing used).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from fnmatch import fnmatchcase

from gateway.core.context import RequestContext
from gateway.core.errors import GatewayError, ModelNotFound
from gateway.core.hooks import Admission, Admitted
from gateway.keys.record import KeyRecord
from gateway.keys.spend import SpendLedger
from gateway.keys.store import KeyStoreUnavailable
from gateway.keys.view import KeysUnavailable, KeyView
from gateway.limits.admission import actual_tokens, expected_output_tokens, unanswered
from gateway.limits.headers import go_duration, rate_limit_message, retry_headers
from gateway.limits.ledger import periods_at
from gateway.limits.limiter import (
    BudgetExceeded,
    Limiter,
    LimitStoreUnavailable,
    RequestsLimitExceeded,
    TokensLimitExceeded,
)
from gateway.limits.store import (
    WINDOW_S,
    BudgetLimits,
    Charge,
    Rejection,
    Reservation,
    Scope,
    StoreUnavailable,
)

log = logging.getLogger("routegate.keys")


def limit_tenant(key_id: str) -> str:
    """The name a key's windows and ledger have in the limit store."""
    return f"key:{key_id}"


def policy_spend_key(digest: str) -> str:
    """How the spend ledger names a policy-file key: its hash's first 12 hex digits."""
    return "policy:" + digest.removeprefix("sha256:")[:12]


def _allowed(record: KeyRecord, ctx: RequestContext) -> bool:
    model = ctx.record.requested_model
    if model in ctx.policy.routes:
        globs = record.allow
    elif model in ctx.policy.targets:
        globs = record.allow_targets
    else:  # a tenant's route alias: its own name is what the key's `allow` lists
        globs = record.allow
    return globs is None or any(fnmatchcase(model, glob) for glob in globs)


class KeyAdmission:
    def __init__(self, inner: Admission, limiter: Limiter, view: KeyView,
                 ledger: SpendLedger, *, clock: Callable[[], float] = time.time) -> None:
        self.inner = inner
        self.limiter = limiter
        self.view = view
        self.ledger = ledger
        self._clock = clock

    async def admit(self, ctx: RequestContext) -> KeyAdmitted:
        """The tenant's admission, and a managed key's own when it has limits. The
        spend ledger charges the managed key's id, a policy key's hash prefix, or ""
        for an anonymous caller."""
        digest = ctx.identity.key_hash
        if digest is None:
            return KeyAdmitted(self, await self.inner.admit(ctx), None, "")
        managed = self.view.entry(digest)
        if managed is None:  # a policy-file key
            return KeyAdmitted(self, await self.inner.admit(ctx), None,
                               policy_spend_key(digest))
        record = managed.record
        if not _allowed(record, ctx):
            raise ModelNotFound(f"The model '{ctx.record.requested_model}' does not exist "
                                "or this key may "
                                "not use it.", param="model")
        tenant = await self.inner.admit(ctx)
        if not record.limited:
            return KeyAdmitted(self, tenant, None, record.id)
        try:
            return KeyAdmitted(self, tenant, await self._admit_key(ctx, record), record.id)
        except (GatewayError, asyncio.CancelledError):
            if tenant is not None:
                await tenant.settle(ctx)  # nothing used: the tenant's tokens come back
            raise

    async def _admit_key(self, ctx: RequestContext, record: KeyRecord) -> Reservation:
        now = self._clock()
        if record.budget_total_micros is not None:
            try:
                spent = await self.ledger.key_total_micros(record.id)
            except KeyStoreUnavailable as exc:
                raise KeysUnavailable("The key's lifetime budget cannot be checked right now "
                                      "(the key store is unavailable); retry shortly.") from exc
            if spent >= record.budget_total_micros:
                raise BudgetExceeded(
                    f"Budget exceeded for key {record.id}: the total budget of "
                    f"{_usd(record.budget_total_micros)} is spent ({_usd(spent)}).",
                    headers=retry_headers(WINDOW_S, should_retry=False))
        scopes: tuple[Scope, ...] = ()
        if record.requests_per_minute is not None or record.tokens_per_minute is not None:
            scopes = (Scope("key", record.requests_per_minute, record.tokens_per_minute),)
        tokens = (ctx.record.estimated_input_tokens or 0) + expected_output_tokens(
            ctx, ctx.policy.resolve_model(ctx.record.requested_model, record.tenant))
        budget = BudgetLimits(record.budget_day_micros, record.budget_month_micros)
        try:
            decision = await self.limiter.store.admit(
                limit_tenant(record.id), scopes, tokens, budget, now, ctx.record.request_id)
        except StoreUnavailable as exc:
            raise LimitStoreUnavailable(
                "Rate limits cannot be checked right now (the limit store is unavailable); "
                "retry shortly.", headers=retry_headers(1.0)) from exc
        if decision.rejection is not None:
            raise _refusal(decision.rejection, record, now)
        assert decision.reservation is not None
        return decision.reservation



class KeyAdmitted:
    """The tenant's admission (settled first: it charges `record.cost_micros`, what every
    report reads) and the key's own reservation, if it has limits."""

    __slots__ = ("admission", "reservation", "spend_key", "tenant")

    def __init__(self, admission: KeyAdmission, tenant: Admitted | None,
                 reservation: Reservation | None, spend_key: str) -> None:
        self.admission, self.tenant, self.reservation = admission, tenant, reservation
        self.spend_key = spend_key

    async def settle(self, ctx: RequestContext) -> None:
        if self.tenant is None:
            return  # nothing admitted: nothing to charge
        try:
            await self.tenant.settle(ctx)  # charges record.cost_micros before it waits
        finally:  # a client gone after its last byte cancels the request: charge it still
            owner = self.admission
            input_tokens, output_tokens = actual_tokens(ctx)
            cost = ctx.record.cost_micros or 0
            attempt = ctx.attempt
            record = ctx.record
            owner.ledger.add(ctx.identity.tenant, self.spend_key, record.requested_model,
                             record.route or "",
                             attempt.target.backend_name if attempt is not None else "",
                             input_tokens, output_tokens, cost)
            if self.reservation is not None:  # the key's own windows and budgets
                await self._settle_key(ctx, input_tokens, output_tokens, cost)

    async def _settle_key(self, ctx: RequestContext, input_tokens: int, output_tokens: int,
                          cost: int) -> None:
        owner = self.admission
        assert self.reservation is not None
        try:
            await owner.limiter.store.settle(
                self.reservation, input_tokens + output_tokens,
                Charge(input_tokens, output_tokens, cost, refund_request=unanswered(ctx)),
                owner._clock())
        except StoreUnavailable as exc:
            log.warning("a key's usage could not be settled: %s", exc)


def _refusal(rejection: Rejection, record: KeyRecord, now: float) -> GatewayError:
    if rejection.kind in ("budget_day", "budget_month"):
        periods = periods_at(now)
        daily = rejection.kind == "budget_day"
        resets_at = periods.day_resets_at if daily else periods.month_resets_at
        wait = resets_at - now
        return BudgetExceeded(
            f"Budget exceeded for key {record.id}: the {'daily' if daily else 'monthly'} "
            f"budget of {_usd(rejection.limit)} is spent ({_usd(rejection.used)}). It resets "
            f"in {go_duration(wait)}.", headers=retry_headers(wait, should_retry=False))
    fits = rejection.retry_after_s is not None
    retry = retry_headers(WINDOW_S if rejection.retry_after_s is None
                          else rejection.retry_after_s, should_retry=fits)
    error = RequestsLimitExceeded if rejection.kind == "requests" else TokensLimitExceeded
    return error(rate_limit_message(rejection, f"key {record.id}"), headers=retry)


def _usd(micros: int) -> str:
    return f"${micros / 1_000_000:,.6f}".rstrip("0").rstrip(".")
