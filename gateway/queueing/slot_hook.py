"""The queue as the pipeline's `hooks.queue`: one slot per attempt, errors it can act on.

For each candidate the pipeline enters `slot(ctx, target)` before the upstream call
and leaves it when the response (the whole stream) has been relayed:

- a request refused at the door (queue full, shed, or a predicted wait beyond
  its budget) raises `BackendSaturated`: the pipeline moves on to the next
  candidate at no cost, and when none is left answers 503 with `Retry-After`;
- a request whose deadline passes while it waits raises `DeadlinePassed` (504);
- a client that disconnects cancels the wait and leaves the queue at once.

The request's deadline is when its first token is due (`gateway/core/deadline.py`: the
route's `latency_budget`, tightened by the request's budget headers);
its priority is its tenant's (`tenants.<name>.priority`, else `defaults.priority`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.core.context import RequestContext
from gateway.core.errors import DeadlinePassed, NoBackendAvailable
from gateway.queueing.errors import QueueDeadlinePassed, QueueRejected
from gateway.queueing.queues import BackendQueues
from gateway.queueing.slots import SlotTicket
from policies.bands import PRIORITIES, Priority
from policies.load import ModelTarget


class BackendSaturated(NoBackendAvailable):
    """A backend's queue refused the request before anything was sent; try elsewhere."""

    code = "backend_overloaded"
    rejection = "shed"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s

    @classmethod
    def for_all(cls, model: str, refusals: Sequence[BackendSaturated],
                reasons: Sequence[str]) -> BackendSaturated:
        """Every candidate refused: shed now, and say when the first may have room."""
        return cls(f"No backend can take '{model}' now: " + "; ".join(reasons) + ".",
                   retry_after_s=min(refusal.retry_after_s for refusal in refusals))


class QueueSlotHook:
    def __init__(self, queues: BackendQueues) -> None:
        self.queues = queues

    def slot(self, ctx: RequestContext, target: ModelTarget) -> _Slot:
        return _Slot(self, ctx, target)

    def deadline(self, ctx: RequestContext) -> float | None:
        """When the request's first token is due (`ctx.deadline`), on the queue's clock;
        None when the request has no budget."""
        deadline = ctx.deadline
        if deadline is None or deadline.first_token_at == math.inf:
            return None
        return self.queues.clock.now() + deadline.first_token_at - ctx.timing.clock()


def priority_of(ctx: RequestContext, tenant: str) -> Priority:
    spec = ctx.policy.file.tenants.get(tenant)
    return spec.priority if spec is not None else ctx.policy.file.defaults.priority


_BANDS: dict[str, Priority] = {band: band for band in PRIORITIES}


def _band(priority: str) -> Priority:
    return _BANDS.get(priority, "normal")


class _Slot:
    """One attempt's place in its backend's queue (a class rather than an
    @asynccontextmanager: no generator per request)."""

    __slots__ = ("_ctx", "_hook", "_target", "_tickets")

    def __init__(self, hook: QueueSlotHook, ctx: RequestContext, target: ModelTarget) -> None:
        self._hook, self._ctx, self._target = hook, ctx, target
        self._tickets: list[SlotTicket] = []

    async def __aenter__(self) -> None:
        ctx, target = self._ctx, self._target
        try:
            await self._acquire_all()
        except QueueRejected as exc:
            raise BackendSaturated(f"{target.key} is saturated ({exc})",
                                   retry_after_s=exc.retry_after_s) from exc
        except QueueDeadlinePassed as exc:
            raise DeadlinePassed(
                f"The request's time-to-first-token budget ran out after it waited "
                f"{exc.waited_s:.2f} s in the queue for backend '{target.backend_name}'."
            ) from exc
        tickets = self._tickets
        ctx.timing.add_wait("queue", sum(ticket.waited_s for ticket in tickets))

    async def _acquire_all(self) -> None:
        """A slot in each of the target's queues (its own, then its backend's), or none."""
        ctx, target, queues = self._ctx, self._target, self._hook.queues
        tenant = ctx.identity.tenant
        # the band the pipeline chose (a batch line: the lowest, whatever its tenant)
        priority, deadline = _band(ctx.record.priority), self._hook.deadline(ctx)
        tickets = self._tickets
        try:
            for key in queues.queue_keys(target):
                tickets.append(await queues.acquire(key, tenant=tenant, priority=priority,
                                                    deadline=deadline))
        except BaseException:
            for held in tickets:  # a model slot taken before its backend refused
                held.release()
            tickets.clear()
            raise

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: object) -> None:
        for ticket in self._tickets:
            ticket.release()
