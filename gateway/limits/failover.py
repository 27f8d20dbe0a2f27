"""What happens to limits when Redis is unreachable or too slow: `on_store_error`.

`fail_closed` rejects while the store is down; `fail_open` decides locally with
this replica's share of every limit (`limit // replicas`), so N replicas
together still admit about the global limit. Either way, once one call has
failed no request touches Redis until a background probe (a PING every
`probe_interval_s`, bounded by the client's timeouts) sees it answer again, so
no request waits on a dead Redis. Ending an outage drops every pooled
connection first, so a restarted Redis is met with new ones only: one restart is
one outage, not a "back"/"unavailable" flap as stale connections fail one by one. The
outage is logged when it starts, once per `log_interval_s` while it lasts (with
the count of requests decided locally or refused meanwhile; they are not logged
one by one) and when it ends, and counted.

A Redis that answers, but slowly, is out too (`limits.store_latency`,
`store_latency.py`): a call past the call timeout puts it out at once, and so does a
p99 that stays over the budget second after second. Every probe that ends an outage
must answer within the budget, and three in a row must after the p99 put the store
out, so a Redis still slow is not taken back to fail again.

Settlements that could not reach Redis, and the spend of requests admitted
locally, are kept in a bounded queue and replayed into the Redis ledger when
it returns, so budgets stay right across short outages. So is a release for
each admission whose call failed: Redis may have run it all the same (a reply
lost to a timeout), and the request, decided locally, will never settle there.
While Redis is down, a tenant's budget is checked against what Redis last
reported it had spent (plus what this replica has charged since) and the
outage's own spend, so a budget spent before the outage stays spent during it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

from gateway.limits.ledger import PeriodCache
from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import AdmissionUnknown, RedisStore
from gateway.limits.store import (
    BudgetLimits,
    Charge,
    Decision,
    Reservation,
    Scope,
    StoreName,
    StoreUnavailable,
    TenantUsage,
)
from gateway.limits.store_latency import LatencyBudget, LatencyWindow, LoopLag

log = logging.getLogger("routegate.limits")

OnStoreError = Literal["fail_open", "fail_closed"]
OutReason = Literal["unreachable", "slow"]
MAX_UNSETTLED = 100_000  # settlements kept for replay during an outage (oldest dropped)
# probes in a row within the budget that end an outage the p99 began (one ends any other)
FAST_PROBES_AFTER_SLOW_P99 = 3


@dataclass(slots=True)
class _Deferred:
    """A settlement (or, with `release`, a release) Redis has yet to see."""

    reservation: Reservation
    actual_tokens: int
    charge: Charge
    at: float
    release: bool = False


@dataclass(slots=True)
class _KnownSpend:
    """A tenant's spend in the Redis ledger as this replica last learnt it."""

    day: str
    day_micros: int
    month: str
    month_micros: int


class FailoverStore:
    name: StoreName = "redis"

    def __init__(self, primary: RedisStore, *, on_error: OnStoreError = "fail_open",
                 replicas: int = 1, probe_interval_s: float = 1.0,
                 log_interval_s: float = 10.0, latency: LatencyBudget | None = None) -> None:
        self.primary = primary
        self.fallback = MemoryStore(name="fallback", share=replicas)
        self.on_error = on_error
        self.probe_interval_s = probe_interval_s
        self.log_interval_s = log_interval_s
        self.healthy = True
        self.outages = 0  # outages seen since start
        self.fallback_admissions = 0  # admissions decided locally (fail_open)
        self.rejected_unavailable = 0  # admissions refused (fail_closed)
        self.lost_settlements = 0  # dropped from a full replay queue
        self.slow_outages = 0  # outages because it answered too slowly
        self.out_reason: OutReason | None = None  # while out
        self.out_detail = ""  # what put it out, while out
        self.latency = latency
        # the p99 judgement (None: calls are bounded by the primary's timeout alone)
        self.window = (LatencyWindow(latency) if latency is not None
                       and latency.p99_s is not None else None)
        self._lag = LoopLag()
        self._fast_probes = 0  # probes in a row within the budget, while out
        self._fast_probes_needed = 1  # to end the current outage
        self._down_since = 0.0
        self._unsettled: deque[_Deferred] = deque()
        self._probe: asyncio.Task[None] | None = None
        self._settling: set[asyncio.Future[None]] = set()  # held so they are not collected
        # tenant → its Redis spend, kept for budget checks during an outage (one entry
        # per tenant the policy knows)
        self._known: dict[str, _KnownSpend] = {}
        self._periods = PeriodCache()

    async def admit(self, tenant: str, scopes: Sequence[Scope], tokens: int,
                    budget: BudgetLimits, now: float, request_id: str) -> Decision:
        if self.healthy:
            if self.window is not None:
                self._lag.start()
            started = time.monotonic()
            try:
                decision = await self.primary.admit(tenant, scopes, tokens, budget, now,
                                                    request_id)
            except StoreUnavailable as exc:
                self._mark_down(exc)
                if isinstance(exc, AdmissionUnknown):
                    # Redis may have admitted it before the call failed; decided here, the
                    # request never settles there: its tokens go back once Redis answers
                    # (if its receipt shows Redis admitted it).
                    self._defer(_Deferred(exc.reservation, 0, Charge(), now, release=True))
            else:
                self._learnt(tenant, decision, now)
                self._timed(started)
                return decision
        if self.on_error == "fail_closed":
            self.rejected_unavailable += 1
            raise StoreUnavailable("the rate limit store is unavailable")
        self.fallback_admissions += 1
        if budget.day_micros is None and budget.month_micros is None:
            return await self.fallback.admit(tenant, scopes, tokens, budget, now, request_id)
        # The fallback's ledger holds only this outage's spend: check the budget less
        # what Redis had, and report the two together.
        spent_day, spent_month = self._known_spend(tenant, now)
        local_budget = BudgetLimits(
            None if budget.day_micros is None else budget.day_micros - spent_day,
            None if budget.month_micros is None else budget.month_micros - spent_month)
        decision = await self.fallback.admit(tenant, scopes, tokens, local_budget, now,
                                             request_id)
        decision.spent_day_micros += spent_day
        decision.spent_month_micros += spent_month
        rejection = decision.rejection
        if rejection is not None and rejection.kind in ("budget_day", "budget_month"):
            daily = rejection.kind == "budget_day"
            decision.rejection = replace(
                rejection, limit=(budget.day_micros if daily else budget.month_micros) or 0,
                used=decision.spent_day_micros if daily else decision.spent_month_micros)
        return decision

    def status(self) -> dict[str, object]:
        """What `GET /admin/limits` reports: up or out (and why), and the latency window."""
        now = time.monotonic()
        report: dict[str, object] = {
            "store": self.name, "up": self.healthy, "on_store_error": self.on_error,
            "out_reason": self.out_reason, "out_detail": self.out_detail or None,
            "out_for_s": None if self.healthy else round(now - self._down_since, 3),
            "outages": self.outages, "slow_outages": self.slow_outages,
            "fallback_admissions": self.fallback_admissions,
            "unavailable_rejections": self.rejected_unavailable,
            "unsettled": len(self._unsettled), "lost_settlements": self.lost_settlements}
        if self.latency is not None:
            latency: dict[str, object] = {
                "call_timeout_ms": self.latency.call_timeout_s * 1000,
                "p99_budget_ms": None if self.latency.p99_s is None
                else self.latency.p99_s * 1000,
                "window_s": self.latency.window_s}
            if self.window is not None:  # the current second and the one before it
                calls, over, p99 = self.window.recent(now)
                latency.update(recent_calls=calls, recent_over_budget=over,
                               # None past the histogram's last bound (5 s) too
                               recent_p99_ms_at_most=None if p99 is None
                               or p99 == float("inf") else p99 * 1000,
                               loop_lag_ms=round(self._lag.now_s(now) * 1000, 3))
            report["latency"] = latency
        return report

    def _learnt(self, tenant: str, decision: Decision, now: float) -> None:
        """Redis's figures from an admission (kept in place: one per tenant)."""
        periods = self._periods.at(now)
        known = self._known.get(tenant)
        if known is None:
            self._known[tenant] = _KnownSpend(periods.day, decision.spent_day_micros,
                                              periods.month, decision.spent_month_micros)
            return
        known.day, known.day_micros = periods.day, decision.spent_day_micros
        known.month, known.month_micros = periods.month, decision.spent_month_micros

    def _known_spend(self, tenant: str, now: float) -> tuple[int, int]:
        known = self._known.get(tenant)
        if known is None:
            return 0, 0
        periods = self._periods.at(now)
        return (known.day_micros if known.day == periods.day else 0,
                known.month_micros if known.month == periods.month else 0)

    def _charged(self, tenant: str, cost_micros: int, now: float) -> None:
        """Spend that reached the Redis ledger through this replica."""
        known = self._known.get(tenant)
        if known is None or not cost_micros:
            return
        periods = self._periods.at(now)
        if known.day == periods.day:
            known.day_micros += cost_micros
        if known.month == periods.month:
            known.month_micros += cost_micros

    async def settle(self, reservation: Reservation, actual_tokens: int, charge: Charge,
                     now: float) -> None:
        if reservation.store == "fallback":
            await self.fallback.settle(reservation, actual_tokens, charge, now)
            # its spend belongs in the shared ledger too; no Redis window holds it
            self._defer(_Deferred(self.primary.spend_only(reservation), actual_tokens, charge,
                                  now))
            return
        if self.healthy:
            started = time.monotonic()
            # Cancelled meanwhile (the request's task, again, after its client left), the
            # call would stop wherever it was: sent or not. It runs on in a task of its
            # own and is replayed should it fail, so a settlement once begun counts once.
            call = asyncio.ensure_future(self.primary.settle(reservation, actual_tokens,
                                                             charge, now))
            self._settling.add(call)
            call.add_done_callback(self._settling.discard)
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                call.add_done_callback(partial(self._settled_abandoned,
                                               _Deferred(reservation, actual_tokens, charge,
                                                         now)))
                raise
            except StoreUnavailable as exc:
                self._mark_down(exc)
            else:
                self._charged(reservation.tenant, charge.cost_micros, now)
                self._timed(started)
                return
        self._defer(_Deferred(reservation, actual_tokens, charge, now))

    def _settled_abandoned(self, deferred: _Deferred, call: asyncio.Future[None]) -> None:
        """A settlement whose caller was cancelled has ended: kept for replay if it failed."""
        exc = None if call.cancelled() else call.exception()
        if exc is None and not call.cancelled():
            self._charged(deferred.reservation.tenant, deferred.charge.cost_micros, deferred.at)
            return
        if isinstance(exc, StoreUnavailable):
            self._mark_down(exc)
        self._defer(deferred)

    async def usage(self, tenant: str, now: float) -> TenantUsage:
        if not self.healthy:  # as admissions: nothing touches Redis until the probe says
            raise StoreUnavailable("the rate limit store is unavailable")
        return await self.primary.usage(tenant, now)

    async def aclose(self) -> None:
        # settlements under way finish first (each is bounded by the call timeout)
        await asyncio.gather(*self._settling, return_exceptions=True)
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self._lag.aclose()
        await self.primary.aclose()

    def _defer(self, deferred: _Deferred) -> None:
        if len(self._unsettled) >= MAX_UNSETTLED:
            self._unsettled.popleft()
            self.lost_settlements += 1
        self._unsettled.append(deferred)
        if self.healthy:  # a local admission settled after Redis came back
            self._start_probe()

    def _timed(self, started: float) -> None:
        """Judge a call that answered: the store goes out when its p99 passes the budget
        (what the event loop's own lag added is not the store's)."""
        window = self.window
        if window is None:
            return
        ended = time.monotonic()
        if window.observe(ended - started - self._lag.now_s(ended), ended):
            self._mark_down(StoreUnavailable(
                f"its p99 stayed over the budget of {(window.budget.p99_s or 0) * 1000:g} ms "
                f"for {window.budget.window_s} s", slow=True),
                fast_probes_needed=FAST_PROBES_AFTER_SLOW_P99)

    def _probe_answered_in_time(self, started: float) -> bool:
        """Whether an answering probe ends the outage: within the p99 budget, and the
        last of `FAST_PROBES_AFTER_SLOW_P99` in a row after the p99 put the store out."""
        window = self.window
        if window is None or window.budget.p99_s is None:
            return True
        ended = time.monotonic()
        if ended - started - self._lag.now_s(ended) > window.budget.p99_s:
            self._fast_probes = 0
            return False
        self._fast_probes += 1
        return self._fast_probes >= self._fast_probes_needed

    def _mark_down(self, exc: StoreUnavailable, fast_probes_needed: int = 1) -> None:
        if not self.healthy:
            return
        self._fast_probes, self._fast_probes_needed = 0, fast_probes_needed
        self.healthy = False
        self.outages += 1
        self.slow_outages += exc.slow
        self.out_reason, self.out_detail = ("slow" if exc.slow else "unreachable"), str(exc)
        self._down_since = time.monotonic()
        action = (f"deciding locally with 1/{self.fallback.share} of each limit"
                  if self.on_error == "fail_open" else "rejecting requests")
        log.warning("rate limit store %s, %s until it answers%s: %s",
                    "too slow" if exc.slow else "unavailable", action,
                    " in time" if exc.slow else "", exc)
        self._start_probe()

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._recover())

    def _affected(self) -> int:
        """Requests the outages so far have decided locally or refused."""
        return self.fallback_admissions + self.rejected_unavailable

    async def _recover(self) -> None:
        """Probe until Redis answers, replay what it missed, then switch back to it."""
        logged_at, affected = time.monotonic(), self._affected()
        while True:
            if not self.healthy:
                await asyncio.sleep(self.probe_interval_s)
                if time.monotonic() - logged_at >= self.log_interval_s:
                    logged_at, before, affected = time.monotonic(), affected, self._affected()
                    log.warning("rate limit store still unavailable after %.0f s: %d "
                                "requests %s since the last report",
                                logged_at - self._down_since, affected - before,
                                "decided locally" if self.on_error == "fail_open"
                                else "refused")
            try:
                started = time.monotonic()
                await self.primary.ping()
                if not self.healthy and not self._probe_answered_in_time(started):
                    continue  # it answers, but still too slowly to be used
                while self._unsettled:
                    item = self._unsettled[0]
                    if item.release:
                        await self.primary.release(item.reservation, item.at)
                    else:
                        await self.primary.settle(item.reservation, item.actual_tokens,
                                                  item.charge, item.at)
                    self._unsettled.popleft()
                    self._charged(item.reservation.tenant, item.charge.cost_micros, item.at)
            except StoreUnavailable as exc:
                self._mark_down(exc)
                continue
            # Everything the fallback charged is in Redis now (and in `_known`): kept,
            # it would count twice in the next outage.
            self.fallback.clear_ledger()
            if not self.healthy:
                # opened before the outage, most lead nowhere now: requests open anew
                await self.primary.drop_connections()
                log.warning("rate limit store is back after %.1f s; using it again",
                            time.monotonic() - self._down_since)
                if self.window is not None:
                    self.window.clear()  # the calls that put it out weigh no more
                self.out_reason, self.out_detail = None, ""
                self.healthy = True
            return
