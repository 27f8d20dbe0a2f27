"""One backend's concurrency slots and the requests waiting for them.

Invariants (checked by the property test):
- `in_flight` counts granted, unreleased tickets, including a waiter whose slot
  was granted but whose task has not resumed yet;
- someone waits only while every slot that counts against them is taken;
- a released slot goes straight to the next waiter, synchronously, so no
  newcomer can take it in between and no slot is ever lost.

A queue may run one band in the background (`background`, the Batch API's lines on a
backend whose own scheduler hears the band and runs them only in steps no better work
wants): its tickets count in `in_flight` and against one another, but never make a
better band wait, since the backend sets them aside for it. The better bands' limit then
counts `in_flight - background_in_flight`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from gateway.queueing.clock import Clock
from gateway.queueing.errors import Evicted, QueueDeadlinePassed, QueueFull, WouldMissDeadline
from gateway.queueing.fair_share import FairBand, Waiter
from gateway.queueing.shedding import (
    ArrivalRate,
    ShedPolicy,
    WaitEstimate,
    choose_victim,
    estimate_wait,
)
from policies.bands import PRIORITIES, Priority

# Weight of the newest hold time in the running mean: ~10 requests of memory,
# fast enough to follow a backend slowing down.
SERVICE_EWMA_ALPHA = 0.2


@dataclass(slots=True)
class QueueCounters:
    admitted_at_once: int = 0
    queued: int = 0
    granted_from_queue: int = 0
    rejected_full: int = 0
    rejected_deadline: int = 0
    evicted: int = 0
    expired: int = 0
    cancelled: int = 0


@dataclass(eq=False)
class SlotTicket:
    """A held slot. `release()` is idempotent; the context-manager form calls it for you."""

    key: str
    tenant: str
    priority: Priority
    waited_s: float  # from enqueue to grant; 0.0 when a slot was free
    granted_at: float
    _queue: SlotQueue = field(repr=False)
    background: bool = False  # counted in the queue's background_in_flight
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._queue.release(self)


class SlotQueue:
    def __init__(self, key: str, *, limit: int | None, clock: Clock, shed: ShedPolicy,
                 weight_of: Callable[[str], float], service_prior_s: float) -> None:
        if limit is not None and limit < 1:
            raise ValueError("a concurrency limit must be at least 1")
        self.key = key
        self.limit = limit
        self.in_flight = 0
        self.background: Priority | None = None
        self.background_in_flight = 0
        self.mean_service_s = service_prior_s
        self.counters = QueueCounters()
        self._clock = clock
        self._shed = shed
        self._bands = {priority: FairBand(weight_of) for priority in PRIORITIES}
        self._waiting = 0
        self._seq = itertools.count()
        self._arrivals = {priority: ArrivalRate() for priority in PRIORITIES}
        self._measured = False  # mean_service_s is still the prior

    # -- what routing and metrics read -------------------------------------------------

    @property
    def waiting(self) -> int:
        return self._waiting

    def waiting_by_priority(self) -> dict[Priority, int]:
        return {priority: len(band) for priority, band in self._bands.items()}

    def predicted_wait_s(self, priority: Priority = "normal", now: float | None = None) -> float:
        """Mean predicted wait of a request of `priority` arriving now: the waiters ahead
        of it, served at the rate the higher bands' own arrivals leave over."""
        return self.estimate_wait(priority, now).mean_s

    def estimate_wait(self, priority: Priority, now: float | None = None) -> WaitEstimate:
        if self.limit is None:
            return WaitEstimate(0.0, 0)
        now = self._clock.now() if now is None else now
        rank = PRIORITIES.index(priority)
        ahead = sum(len(self._bands[p]) for p in PRIORITIES[: rank + 1])
        higher_rate = sum(self._arrivals[p].per_s(now) for p in PRIORITIES[:rank])
        return estimate_wait(limit=self.limit, in_flight=self._occupied(priority), ahead=ahead,
                             mean_service_s=self.mean_service_s,
                             higher_load=higher_rate * self.mean_service_s / self.limit)

    # -- acquire / release --------------------------------------------------------------

    async def acquire(self, *, tenant: str, priority: Priority, deadline: float | None,
                      now: float | None) -> SlotTicket:
        arrived = self._clock.now() if now is None else now
        if self._has_free_slot(priority):
            background = self._take_slot(priority)
            self.counters.admitted_at_once += 1
            self._arrivals[priority].add(arrived)
            return SlotTicket(self.key, tenant, priority, 0.0, arrived, self, background)
        waiter = self._enqueue(tenant, priority, math.inf if deadline is None else deadline,
                               arrived)
        self._arrivals[priority].add(arrived)
        try:
            granted_at = await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        waited_s = granted_at - arrived
        return SlotTicket(self.key, tenant, priority, waited_s if waited_s > 0.0 else 0.0,
                          granted_at, self, waiter.background)

    def release(self, ticket: SlotTicket) -> None:
        now = self._clock.now()
        if ticket.background:
            # A background hold time includes its pauses: it says nothing of how long
            # the better bands hold a slot.
            self.background_in_flight -= 1
        else:
            held_s = now - ticket.granted_at
            if held_s < 0.0:
                held_s = 0.0
            self.mean_service_s += SERVICE_EWMA_ALPHA * (held_s - self.mean_service_s)
            self._measured = True
        self.in_flight -= 1
        self._dispatch(now)

    def set_limit(self, limit: int | None) -> None:
        """A new limit; a raised one serves waiters at once, a lowered one drains naturally."""
        if limit is not None and limit < 1:
            raise ValueError("a concurrency limit must be at least 1")
        self.limit = limit
        self._dispatch(self._clock.now())

    def set_background(self, priority: Priority | None) -> None:
        """Run `priority` in the background (see the module's note), or no band: tickets
        already held keep counting as they were granted."""
        self.background = priority
        self._dispatch(self._clock.now())

    def set_service_prior(self, seconds: float) -> None:
        """A new declared hold time; ignored once real hold times have been measured."""
        if not self._measured:
            self.mean_service_s = seconds

    # -- internals ----------------------------------------------------------------------

    def _occupied(self, priority: Priority) -> int:
        """Slots that count against a request of `priority`."""
        if self.background is None or priority == self.background:
            return self.in_flight
        return self.in_flight - self.background_in_flight

    def _has_free_slot(self, priority: Priority) -> bool:
        if self.limit is None:
            return True
        waiting_ahead = self._waiting
        if self.background is not None and priority != self.background:
            waiting_ahead -= len(self._bands[self.background])
        return waiting_ahead == 0 and self._occupied(priority) < self.limit

    def _take_slot(self, priority: Priority) -> bool:
        """Count a granted slot; whether it is a background one."""
        self.in_flight += 1
        background = priority == self.background
        self.background_in_flight += background
        return background

    def _enqueue(self, tenant: str, priority: Priority, deadline: float,
                 arrived: float) -> Waiter:
        estimate = self.estimate_wait(priority, arrived)
        predicted = estimate.mean_s
        if arrived + estimate.likely_max_s > deadline:
            self.counters.rejected_deadline += 1
            raise WouldMissDeadline(
                self.key,
                f"{self.key!r} is saturated: the queue wait is predicted at {predicted:.2f} s "
                f"(up to {estimate.likely_max_s:.2f} s) and only "
                f"{max(0.0, deadline - arrived):.2f} s are left of the budget",
                retry_after_s=predicted, predicted_wait_s=predicted,
            )
        if self._waiting >= self._shed.cap(priority):
            victim = choose_victim(self._bands, priority)
            if victim is None:
                self.counters.rejected_full += 1
                raise QueueFull(
                    self.key,
                    f"the queue for {self.key!r} is full for {priority}-priority requests "
                    f"({self._waiting} waiting)",
                    retry_after_s=predicted,
                )
            self._evict(victim, predicted)
        loop = asyncio.get_running_loop()
        waiter = Waiter(tenant, priority, deadline, arrived, next(self._seq),
                        loop.create_future())
        self._bands[priority].push(waiter)
        self._waiting += 1
        self.counters.queued += 1
        if deadline != math.inf:
            waiter.timer = self._clock.call_at(deadline, lambda: self._expire(waiter, None))
        return waiter

    def _take_out(self, waiter: Waiter) -> None:
        if waiter.queued:
            waiter.queued = False
            self._bands[waiter.priority].remove(waiter)
            self._waiting -= 1
            if waiter.timer is not None:
                waiter.timer.cancel()

    def _abandon(self, waiter: Waiter) -> None:
        """The waiting task was cancelled (client gone): leave now, pass on a granted slot."""
        future = waiter.future
        if waiter.queued:
            self._take_out(waiter)
            self.counters.cancelled += 1
        elif future.done() and not future.cancelled() and future.exception() is None:
            # Granted just before the cancellation landed: nobody will release it.
            self.in_flight -= 1
            self.background_in_flight -= waiter.background
            self._dispatch(self._clock.now())

    def _expire(self, waiter: Waiter, now: float | None) -> None:
        if not waiter.queued:
            return
        now = self._clock.now() if now is None else now
        self._take_out(waiter)
        self._fail(waiter, QueueDeadlinePassed(self.key, max(0.0, now - waiter.arrived)))

    def _evict(self, victim: Waiter, predicted_s: float) -> None:
        self._take_out(victim)
        self._fail(victim, Evicted(
            self.key,
            f"shed from the queue for {self.key!r} to make room for a higher-priority request",
            retry_after_s=predicted_s,
        ))

    def _fail(self, waiter: Waiter, exc: Exception) -> None:
        if waiter.future.done():
            # Cancelled a moment ago; its task has not run its cleanup yet.
            self.counters.cancelled += 1
            return
        if isinstance(exc, QueueDeadlinePassed):
            self.counters.expired += 1
        else:
            self.counters.evicted += 1
        waiter.future.set_exception(exc)

    def _pop_next(self) -> Waiter | None:
        """The first waiter of the best band waiting, if a slot is free for it (a worse
        band's waiter never has one when a better one's has none)."""
        for priority in PRIORITIES:
            band = self._bands[priority]
            if not len(band):
                continue
            if self.limit is not None and self._occupied(priority) >= self.limit:
                return None
            waiter = band.pop()
            if waiter is not None:
                waiter.queued = False
                self._waiting -= 1
                if waiter.timer is not None:
                    waiter.timer.cancel()
                return waiter
        return None

    def _dispatch(self, now: float) -> None:
        while self._waiting:
            waiter = self._pop_next()
            if waiter is None:
                break
            if waiter.future.done():
                self.counters.cancelled += 1  # cancelled, cleanup not run yet
                continue
            if waiter.deadline <= now:
                # Its budget is gone: a slot now would only produce a late answer.
                self._fail(waiter, QueueDeadlinePassed(self.key, max(0.0, now - waiter.arrived)))
                continue
            waiter.background = self._take_slot(waiter.priority)
            self.counters.granted_from_queue += 1
            waiter.future.set_result(now)


class Acquisition:
    """`await queues.acquire(...)` → SlotTicket, or `async with queues.acquire(...) as ticket:`."""

    __slots__ = ("_deadline", "_now", "_priority", "_queue", "_tenant", "_ticket")

    def __init__(self, queue: SlotQueue, tenant: str, priority: Priority,
                 deadline: float | None, now: float | None) -> None:
        self._queue = queue
        self._tenant = tenant
        self._priority = priority
        self._deadline = deadline
        self._now = now
        self._ticket: SlotTicket | None = None

    def __await__(self) -> Generator[Any, None, SlotTicket]:
        return self._queue.acquire(tenant=self._tenant, priority=self._priority,
                                   deadline=self._deadline, now=self._now).__await__()

    async def __aenter__(self) -> SlotTicket:
        self._ticket = await self
        return self._ticket

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._ticket is not None:
            self._ticket.release()
