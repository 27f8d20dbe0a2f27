"""Deterministic drivers for queue tests: a hand-moved clock and requests as tasks."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from gateway.queueing import BackendQueues, Priority, QueueDeadlinePassed, QueueRejected, SlotTicket


class ManualTimer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.time = start
        self._timers: list[tuple[float, int, ManualTimer, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[[], None]) -> ManualTimer:
        timer = ManualTimer()
        heapq.heappush(self._timers, (when, next(self._seq), timer, callback))
        return timer

    def advance(self, seconds: float) -> None:
        self.time += seconds
        while self._timers and self._timers[0][0] <= self.time:
            _, _, timer, callback = heapq.heappop(self._timers)
            if not timer.cancelled:
                callback()


async def settle() -> None:
    """Let every ready task run until it blocks again (no clock time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Harness:
    """Requests as tasks on one queue, recording the order in which they get slots."""

    def __init__(self, queues: BackendQueues, key: str) -> None:
        self.queues = queues
        self.key = key
        self.granted: list[str] = []
        self.tickets: dict[str, SlotTicket] = {}
        self.tasks: dict[str, asyncio.Task[SlotTicket | None]] = {}
        self.failed: dict[str, Exception] = {}  # label → why it got no slot

    def arrive(self, label: str, *, tenant: str = "acme", priority: Priority = "normal",
               deadline: float | None = None) -> asyncio.Task[SlotTicket | None]:
        async def request() -> SlotTicket | None:
            try:
                ticket = await self.queues.acquire(self.key, tenant=tenant, priority=priority,
                                                   deadline=deadline)
            except (QueueRejected, QueueDeadlinePassed) as exc:
                self.failed[label] = exc
                return None
            self.granted.append(label)
            self.tickets[label] = ticket
            return ticket

        task = asyncio.get_running_loop().create_task(request())
        self.tasks[label] = task
        return task

    async def arrive_all(self, *labels: str, **kwargs: Any) -> None:
        for label in labels:
            self.arrive(label, **kwargs)
            await settle()

    async def finish(self, label: str) -> None:
        self.tickets[label].release()
        await settle()
