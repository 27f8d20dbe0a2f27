"""In-process limit store: the embedded default, and the fail-open fallback.

The sliding-window log (see `store.py`) as a deque per scope. One event loop
owns it and no call awaits between check and reserve, so each admission is
atomic without a lock. Memory is bounded: a scope holds at most one entry per
request admitted in the last minute, and the ledger keeps only the current day
and month per tenant.

An entry is a plain tuple of numbers, not an object: the garbage collector stops
tracking such tuples, and a busy minute's log (≈ 180,000 entries a scope at 3,000
requests/s) would otherwise be walked by every full collection — pauses of tens to
hundreds of milliseconds on the event loop.
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
    """One scope's log: `(admitted at, tokens, sequence number)` per request, oldest
    first. Entries leave in order, so one number (`expired_seq`) says which are gone.
    A settled request's correction of its tokens (actual − reserved) waits in
    `corrections`, by sequence number, until its entry leaves."""

    __slots__ = ("corrections", "entries", "expired_seq", "next_seq", "tokens")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, int, int]] = deque()
        self.tokens = 0
        self.next_seq = 0
        self.expired_seq = -1  # entries up to this one have left the window
        self.corrections: dict[int, int] = {}

    def add(self, at: float, tokens: int) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        self.entries.append((at, tokens, seq))
        self.tokens += tokens
        return seq

    def holds(self, seq: int) -> bool:
        return seq > self.expired_seq

    def correct(self, seq: int, delta: int) -> None:
        """Tokens of a held entry, now that the request's usage is known."""
        corrections = self.corrections
        corrections[seq] = corrections.get(seq, 0) + delta
        self.tokens += delta

    def expire(self, cutoff: float) -> None:
        entries, corrections = self.entries, self.corrections
        while entries and entries[0][0] <= cutoff:
            _, tokens, seq = entries.popleft()
            self.expired_seq = seq
            self.tokens -= tokens + (corrections.pop(seq, 0) if corrections else 0)

    def tokens_retry_after(self, needed: int, limit: int, now: float) -> float:
        """Seconds until enough old entries leave for `needed` more tokens to fit."""
        excess = self.tokens + needed - limit
        corrections = self.corrections
        for at, tokens, seq in self.entries:
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
            entries = window.entries
            if entries and entries[0][0] <= cutoff:
                window.expire(cutoff)
            windows.append(window)
            if rejection is not None:
                continue
            rpm, tpm = scope.requests_per_minute, scope.tokens_per_minute
            count = len(entries)
            if rpm is not None and count >= rpm:
                rejection = Rejection("requests", scope, rpm, count, 1,
                                      max(0.0, entries[0][0] + WINDOW_S - now)
                                      if entries else WINDOW_S)
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
            ScopeState(scope, len(window.entries), window.tokens,
                       window.entries[0][0] if window.entries else None)
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
                window.add(now, delta)
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

