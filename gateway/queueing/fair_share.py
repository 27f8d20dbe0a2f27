"""One priority band of a backend's queue: fair across tenants, earliest deadline within one.

Start-time fair queueing (Goyal et al., 1996) at tenant granularity: each
backlogged tenant carries a virtual start tag, the tenant with the smallest tag
is served next, and serving it advances its tag by `1 / weight`. Two always-busy
tenants of equal weight therefore alternate however many requests each has
queued, so a tenant sending 10× the traffic cannot starve another; a tenant that
was idle re-enters at the band's current virtual time, so idling banks no credit.
Inside one tenant's lane requests leave in earliest-deadline order; across
tenants with equal tags the earlier deadline wins, then the earlier arrival.

Picking the next tenant scans the backlogged tenants (O(tenants waiting in this
band on this backend), a handful in practice), which is cheaper than keeping a
second heap consistent under cancellations.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gateway.queueing.clock import TimerHandle
from policies.bands import Priority


@dataclass(eq=False, slots=True)
class Waiter:
    """One request waiting for a slot; its future resolves to the time the slot was granted."""

    tenant: str
    priority: Priority
    deadline: float  # on the queue's clock; math.inf when the request has none
    arrived: float
    seq: int  # arrival order, unique per queue
    future: asyncio.Future[float]
    timer: TimerHandle | None = None
    queued: bool = True
    background: bool = False  # granted a background slot (SlotQueue.background)


@dataclass(slots=True)
class _Lane:
    start_tag: float
    heap: list[tuple[float, int, Waiter]] = field(default_factory=list)  # (deadline, seq, waiter)


class FairBand:
    """Waiters of one priority on one backend."""

    # Forgotten finish tags are only re-learned as "now", so pruning loses nothing;
    # the bound keeps a stream of one-off tenants from growing the map.
    _MAX_IDLE_TAGS = 1024

    def __init__(self, weight_of: Callable[[str], float]) -> None:
        self._weight_of = weight_of
        self._lanes: dict[str, _Lane] = {}  # backlogged tenants only
        self._finish_tag: dict[str, float] = {}
        self._virtual_time = 0.0
        self._by_seq: dict[int, Waiter] = {}  # insertion-ordered: the newest is last

    def __len__(self) -> int:
        return len(self._by_seq)

    def __iter__(self) -> Iterator[Waiter]:
        return iter(list(self._by_seq.values()))

    def push(self, waiter: Waiter) -> None:
        lane = self._lanes.get(waiter.tenant)
        if lane is None:
            start = max(self._virtual_time, self._finish_tag.get(waiter.tenant, 0.0))
            lane = self._lanes[waiter.tenant] = _Lane(start)
        heapq.heappush(lane.heap, (waiter.deadline, waiter.seq, waiter))
        self._by_seq[waiter.seq] = waiter

    def pop(self) -> Waiter | None:
        """The next waiter to serve, charged to its tenant's share; None when empty."""
        best: tuple[float, float, int] | None = None
        best_tenant = ""
        for tenant, lane in self._lanes.items():
            deadline, seq, _ = lane.heap[0]
            rank = (lane.start_tag, deadline, seq)
            if best is None or rank < best:
                best, best_tenant = rank, tenant
        if best is None:
            return None
        lane = self._lanes[best_tenant]
        _, _, waiter = heapq.heappop(lane.heap)
        del self._by_seq[waiter.seq]
        self._virtual_time = lane.start_tag
        finish = lane.start_tag + 1.0 / self._weight_of(best_tenant)
        self._finish_tag[best_tenant] = finish
        if lane.heap:
            lane.start_tag = finish
        else:
            del self._lanes[best_tenant]
            if len(self._finish_tag) > self._MAX_IDLE_TAGS:
                self._prune_finish_tags()
        return waiter

    def remove(self, waiter: Waiter) -> None:
        """Take out a waiter that leaves without being served (cancelled, expired, evicted).

        It is not charged: its tenant keeps the same place in the rotation.
        """
        del self._by_seq[waiter.seq]
        lane = self._lanes[waiter.tenant]
        lane.heap.remove((waiter.deadline, waiter.seq, waiter))
        if lane.heap:
            heapq.heapify(lane.heap)
        else:
            del self._lanes[waiter.tenant]

    def newest(self) -> Waiter | None:
        """The most recent arrival: the one shed first when a more urgent request needs room."""
        if not self._by_seq:
            return None
        return self._by_seq[next(reversed(self._by_seq))]

    def _prune_finish_tags(self) -> None:
        # An idle tenant whose tag is not ahead of virtual time would re-enter at
        # virtual time anyway.
        self._finish_tag = {
            tenant: tag for tenant, tag in self._finish_tag.items()
            if tenant in self._lanes or tag > self._virtual_time
        }
