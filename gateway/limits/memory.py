"""In-process limit store: the embedded default, and the fail-open fallback.

The sliding-window log (see `store.py`) as a deque per scope. One event loop
owns it and no call awaits between check and reserve, so each admission is
atomic without a lock. Memory is bounded: a scope holds at most one entry per
request admitted in the last minute, and the ledger keeps only the current day
and month per tenant.

A window keeps its entries as two columns of plain numbers, not as an object (or a
tuple) per request: numbers are no work for the garbage collector. A busy minute's
log — about 180,000 entries a scope at 3,000 requests/s — made of tracked objects
filled the young generation, whose collections then paused the event loop for tens
of milliseconds, and later the older ones for more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from gateway.limits.ledger import PeriodCache
from gateway.limits.store import (
    WINDOW_S,
    BudgetLimits,
    Charge,
    Decision,
    PeriodUsage,
    Rejection,
    Reservation,
    Scope,
    ScopeState,
    StoreName,
    TenantUsage,
)


class _Window:
    """One scope's log, oldest first: when each request was admitted (`ats`) and its
    tokens (`amounts`). An entry's sequence number counts every entry ever added;
    entries leave in order, so `expired` (how many have left) tells which are held.
    A settled request's correction of its tokens (actual − reserved) waits in
    `corrections`, by sequence number, until its entry leaves. Extra tokens charged
    after a request's own entry left (`add_late`) are entries that carry tokens but
    are no request: their sequence numbers, ascending, are in `late`, and `requests`
    leaves them out (the request was counted once, when admitted)."""

    __slots__ = ("amounts", "ats", "corrections", "expired", "late", "tokens")

    def __init__(self) -> None:
        self.ats: deque[float] = deque()
        self.amounts: deque[int] = deque()
        self.tokens = 0
        self.expired = 0
        self.corrections: dict[int, int] = {}
        self.late: deque[int] = deque()

    @property
    def requests(self) -> int:
        return len(self.ats) - len(self.late)

    def oldest_request_at(self) -> float | None:
        """When the oldest request in the window was admitted (late charges skipped)."""
        seq, late = self.expired, self.late
        for late_seq in late:  # ascending; usually empty
            if late_seq != seq:
                break
            seq += 1
        index = seq - self.expired
        return self.ats[index] if index < len(self.ats) else None

    def add(self, at: float, tokens: int) -> int:
        """Log a request; its sequence number."""
        self.ats.append(at)
        self.amounts.append(tokens)
        self.tokens += tokens
        return self.expired + len(self.ats) - 1

    def add_late(self, at: float, tokens: int) -> None:
        """Charge tokens of a request whose own entry already left the window."""
        self.late.append(self.add(at, tokens))

    def holds(self, seq: int) -> bool:
        return seq >= self.expired

    def correct(self, seq: int, delta: int) -> None:
        """Tokens of a held entry, now that the request's usage is known."""
        corrections = self.corrections
        corrections[seq] = corrections.get(seq, 0) + delta
        self.tokens += delta

    def expire(self, cutoff: float) -> None:
        ats, amounts, corrections = self.ats, self.amounts, self.corrections
        while ats and ats[0] <= cutoff:
            ats.popleft()
            left = amounts.popleft()
            if corrections:
                left += corrections.pop(self.expired, 0)
            self.tokens -= left
            if self.late and self.late[0] == self.expired:
                self.late.popleft()
            self.expired += 1

    def tokens_retry_after(self, needed: int, limit: int, now: float) -> float:
        """Seconds until enough old entries leave for `needed` more tokens to fit."""
        excess = self.tokens + needed - limit
        corrections = self.corrections
        for seq, (at, tokens) in enumerate(zip(self.ats, self.amounts, strict=True),
                                           self.expired):
            excess -= tokens + corrections.get(seq, 0)
            if excess <= 0:
                return max(0.0, at + WINDOW_S - now)
        return WINDOW_S


class MemoryStore:
    """Limits and spend for one process; `share` divides every limit (fail-open)."""

    def __init__(self, *, name: StoreName = "memory", share: int = 1) -> None:
        self.name: StoreName = name
        self.share = share  # every limit is divided by it
        self._windows: dict[tuple[str, str], _Window] = {}
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
        cutoff = now - WINDOW_S
        all_windows = self._windows
        windows: list[_Window] = []
        rejection: Rejection | None = None
        for scope in scopes:
            window = all_windows.get((tenant, scope.key))
            if window is None:
                window = all_windows[(tenant, scope.key)] = _Window()
            ats = window.ats
            if ats and ats[0] <= cutoff:
                window.expire(cutoff)
            windows.append(window)
            if rejection is not None:
                continue
            rpm, tpm = scope.requests_per_minute, scope.tokens_per_minute
            count = window.requests
            if rpm is not None and count >= rpm:
                oldest = window.oldest_request_at()
                rejection = Rejection("requests", scope, rpm, count, 1,
                                      WINDOW_S if oldest is None
                                      else max(0.0, oldest + WINDOW_S - now))
            elif tpm is not None and window.tokens + tokens > tpm:
                rejection = Rejection("tokens", scope, tpm, window.tokens, tokens,
                                      None if tokens > tpm
                                      else window.tokens_retry_after(tokens, tpm, now))
        reservation = None
        if rejection is None:
            placed = [(window, window.add(now, tokens)) for window in windows]
            # the reservation carries its entries, so nothing is left behind if it is
            # never settled
            reservation = Reservation(request_id, tenant, tuple(scopes), tokens, now,
                                      self.name, placed)
        states = tuple([
            ScopeState(scope, window.requests, window.tokens,
                       window.ats[0] if window.ats else None)
            for scope, window in zip(scopes, windows, strict=True)
        ])
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
        cutoff = now - WINDOW_S
        placed: list[tuple[_Window, int]] = reservation.handle or []  # type: ignore[assignment]
        for window, seq in placed:
            window.expire(cutoff)
            if window.holds(seq):
                if delta:
                    window.correct(seq, delta)
            elif delta > 0:  # aged out before the usage was known: charge it now
                window.add_late(now, delta)
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

