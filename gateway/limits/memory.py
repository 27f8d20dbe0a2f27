"""In-process limit store: the embedded default, and the fail-open fallback.

The sliding-window counter of `window_counter.py`, one `Window` (five integers) per
scope. One event loop owns it and no call awaits between check and count, so each
admission is atomic without a lock. Memory is bounded by the scopes, not the traffic:
a scope's window is the same size at one request a minute or thousands a second, and
the ledger keeps only the current day and month per tenant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gateway.limits.ledger import PeriodCache
from gateway.limits.store import (
    BudgetLimits,
    Charge,
    Decision,
    PeriodUsage,
    Rejection,
    Reservation,
    Scope,
    StoreName,
    TenantUsage,
)
from gateway.limits.window_counter import (
    Window,
    counted_in_ms,
    refusal,
    scope_state,
    to_ms,
)


class MemoryStore:
    """Limits and spend for one process; `share` divides every limit (fail-open)."""

    def __init__(self, *, name: StoreName = "memory", share: int = 1) -> None:
        self.name: StoreName = name
        self.share = share  # every limit is divided by it
        self._windows: dict[tuple[str, str], Window] = {}  # (tenant, scope key) → its window
        self._ledger: dict[str, tuple[PeriodUsage, PeriodUsage]] = {}
        self._periods_cache = PeriodCache()

    def admit_now(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                  budget: BudgetLimits, now: float, request_id: str) -> Decision:
        """The synchronous admission (`admit` without the coroutine, for benchmarks)."""
        day, month = self._periods(tenant, now)
        if budget.day_micros is not None and day.spend_micros >= budget.day_micros:
            return self._over_budget("budget_day", budget.day_micros, day, month)
        if budget.month_micros is not None and month.spend_micros >= budget.month_micros:
            return self._over_budget("budget_month", budget.month_micros, day, month)

        if self.share != 1:  # limits as this replica's share, in decisions and headers alike
            scopes = [self._scaled(scope) for scope in scopes]
        now_ms = to_ms(now)
        all_windows = self._windows
        windows: list[Window] = []
        elapsed: list[int] = []
        rejection: Rejection | None = None
        for scope in scopes:
            window = all_windows.get((tenant, scope.key))
            if window is None:
                window = all_windows[(tenant, scope.key)] = Window()
            windows.append(window)
            elapsed.append(window.roll(now_ms))
            if rejection is None:
                rejection = refusal(scope, window, elapsed[-1], tokens)
        reservation = None
        if rejection is None:
            for window in windows:
                window.count(tokens)
            reservation = Reservation(request_id, tenant, tuple(scopes), tokens, now,
                                      self.name, tuple([w.start_ms for w in windows]))
        states = tuple([scope_state(scope, window, at)
                        for scope, window, at in zip(scopes, windows, elapsed, strict=True)])
        return Decision(reservation, rejection, states, day.spend_micros, month.spend_micros)

    def _scaled(self, scope: Scope) -> Scope:
        rpm, tpm = scope.requests_per_minute, scope.tokens_per_minute
        return Scope(scope.key, None if rpm is None else max(1, rpm // self.share),
                     None if tpm is None else max(1, tpm // self.share))

    async def admit(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                    budget: BudgetLimits, now: float, request_id: str) -> Decision:
        return self.admit_now(tenant, scopes, tokens, budget, now, request_id)

    async def settle(self, reservation: Reservation, actual_tokens: int, charge: Charge,
                     now: float) -> None:
        delta = actual_tokens - reservation.tokens
        if delta or charge.refund_request:
            now_ms = to_ms(now)
            for scope, counted_in in zip(reservation.scopes, counted_in_ms(reservation),
                                         strict=True):
                window = self._windows.get((reservation.tenant, scope.key))
                if window is not None:
                    window.roll(now_ms)
                    window.reconcile(counted_in, delta, charge.refund_request)
        for period in self._periods(reservation.tenant, now):
            period.requests += 1
            period.input_tokens += charge.input_tokens
            period.output_tokens += charge.output_tokens
            period.spend_micros += charge.cost_micros

    async def usage(self, tenant: str, now: float) -> TenantUsage:
        day, month = self._periods(tenant, now)
        return TenantUsage(tenant, replace(day), replace(month))

    async def aclose(self) -> None:
        return None

    def clear_ledger(self) -> None:
        """Forget all spend: the fail-open fallback's, once it has reached Redis."""
        self._ledger.clear()

    def _periods(self, tenant: str, now: float) -> tuple[PeriodUsage, PeriodUsage]:
        periods = self._periods_cache.at(now)
        current = self._ledger.get(tenant)
        if current is None or current[0].period != periods.day:
            # a new day (and maybe month): older periods are dropped, keeping memory bounded
            month = (current[1] if current is not None and current[1].period == periods.month
                     else PeriodUsage(periods.month))
            current = self._ledger[tenant] = (PeriodUsage(periods.day), month)
        return current

    def _over_budget(self, kind: str, limit: int, day: PeriodUsage,
                     month: PeriodUsage) -> Decision:
        used = day.spend_micros if kind == "budget_day" else month.spend_micros
        rejection = Rejection("budget_day" if kind == "budget_day" else "budget_month",
                              None, limit, used, 0, None)
        return Decision(None, rejection, (), day.spend_micros, month.spend_micros)

