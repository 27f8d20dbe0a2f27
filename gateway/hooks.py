"""The pipeline's plug points, with the do-nothing defaults the core ships with.

`create_app` builds one `Hooks` and the pipeline calls it at fixed steps (see
`gateway/pipeline/steps.py` for the order). Each plug-in replaces one field:

  hooks.admission  rate-limit admission before routing, settlement after the response
  hooks.router     ordered candidates for a request (primary first, then fallbacks)
  hooks.queue      a per-backend slot held for the whole upstream call of one attempt
  hooks.cache      a kept answer instead of a backend call; keeping answers after settling
  hooks.observers  told when a request starts, after each attempt, at the end
  hooks.telemetry  spans, metrics, access log, dashboard data (gateway/telemetry)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from gateway.errors import ModelNotFound
from gateway.pipeline.context import Attempt, RequestContext
from gateway.telemetry.service import Telemetry
from gateway.upstream.pool import Upstream
from policies.load import ModelTarget


class Admission(Protocol):
    async def admit(self, ctx: RequestContext) -> None:
        """Raise `RateLimited` (with headers) to refuse; may leave its ticket on `ctx.ticket`."""

    async def settle(self, ctx: RequestContext) -> None:
        """Called once for every admitted request, even failed or cancelled ones;
        `ctx.usage` holds the actual usage when the backend reported it."""


class Router(Protocol):
    def __call__(self, ctx: RequestContext) -> Sequence[ModelTarget]:
        """Candidates in order; may set `ctx.decision`. Empty → 503 no backend."""


class QueueSlots(Protocol):
    def slot(self, ctx: RequestContext,
             target: ModelTarget) -> AbstractAsyncContextManager[None]:
        """Held while one attempt talks to `target`; time spent waiting for it should be
        recorded with `ctx.timing.add_wait("queue", seconds)`."""


class Observer(Protocol):
    def request_started(self, ctx: RequestContext) -> None: ...

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None: ...

    def request_finished(self, ctx: RequestContext) -> None:
        """After the last byte (or the error) went to the client; ctx.status is final."""


class ReplicaChoice(Protocol):
    def choose(self, ctx: RequestContext, target: ModelTarget,
               upstream: Upstream) -> Upstream | None:
        """What this attempt is sent through (None: no replica can serve it)."""


class Cache(Protocol):
    def plan(self, ctx: RequestContext) -> object | None:
        """What the cache will do for this request (routing has run); None: nothing, and
        neither `serve` nor `keep` is called."""

    async def serve(self, ctx: RequestContext) -> web.StreamResponse | None:
        """A kept answer, sent (no backend is called), or None; `ctx.cache_plan` is set."""

    async def keep(self, ctx: RequestContext, response: web.StreamResponse) -> None:
        """After settlement: keep what was answered, if it may be."""


class NoCache:
    def plan(self, ctx: RequestContext) -> None:
        return None

    async def serve(self, ctx: RequestContext) -> web.StreamResponse | None:
        return None

    async def keep(self, ctx: RequestContext, response: web.StreamResponse) -> None:
        return None


class NoAdmission:
    async def admit(self, ctx: RequestContext) -> None:
        return None

    async def settle(self, ctx: RequestContext) -> None:
        return None


class NoQueue:
    def slot(self, ctx: RequestContext,
             target: ModelTarget) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


def route_targets_in_order(ctx: RequestContext) -> Sequence[ModelTarget]:
    """Stand-in router: the route's targets in the order written (disabled backends are
    already gone from the runtime policy), or the one `backend/model` named directly."""
    policy = ctx.policy
    route = policy.routes.get(ctx.model)
    if route is not None:
        return [policy.targets[key] for key in route.targets if key in policy.targets]
    target = policy.targets.get(ctx.model)
    if target is None:
        raise ModelNotFound(f"The model '{ctx.model}' does not exist.", param="model")
    return [target]


@dataclass(slots=True)
class Hooks:
    admission: Admission = field(default_factory=NoAdmission)
    router: Router = route_targets_in_order
    queue: QueueSlots = field(default_factory=NoQueue)
    cache: Cache = field(default_factory=NoCache)
    observers: list[Observer] = field(default_factory=list)
    telemetry: Telemetry = field(default_factory=Telemetry)
    max_attempts: int = 3  # candidates tried per request, the primary included
    # a dedicated backend's replica and cache salt per attempt (`gateway/route/replica_call`)
    replicas: ReplicaChoice | None = None
