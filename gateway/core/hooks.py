"""The pipeline's plug points, with the do-nothing defaults the core ships with.

The plug-ins listed in `gateway.app.PLUGINS` provide them (`gateway.plugin`), the
pipeline calls them at fixed steps (see `gateway/pipeline/steps.py` for the order):

  hooks.admission  rate-limit admission before routing, settlement after the response
  hooks.router     ordered candidates for a request (primary first, then fallbacks)
  hooks.queue      a per-backend slot held for the whole upstream call of one attempt
  hooks.cache      a kept answer instead of a backend call; keeping answers after settling
  hooks.observers  told when a request starts, after each attempt, at the end
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from aiohttp import web

from gateway.core.attempt_facts import Attempt
from gateway.core.context import RequestContext
from gateway.core.errors import ModelNotFound
from policies.load import ModelTarget

Plan = TypeVar("Plan")


class Admitted(Protocol):
    async def settle(self, ctx: RequestContext) -> None:
        """Called once for every admitted request, even failed or cancelled ones, after
        the last byte went to the client; the record holds the actual usage when the
        backend reported it."""


class Admission(Protocol):
    async def admit(self, ctx: RequestContext) -> Admitted | None:
        """Raise `RateLimited` (with headers) to refuse; what it returns is settled once
        the request is over (None: nothing to settle)."""


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
        """After the last byte (or the error) went to the client; `ctx.record.status` is
        final."""


class Cache(Protocol[Plan]):
    """The pipeline holds a request's plan for the cache and hands it back; only the
    cache reads it."""

    def plan(self, ctx: RequestContext) -> Plan | None:
        """What the cache will do for this request (routing has run); None: nothing, and
        neither `serve` nor `keep` is called."""

    async def serve(self, ctx: RequestContext, plan: Plan) -> web.StreamResponse | None:
        """A kept answer, sent (no backend is called), or None."""

    async def keep(self, ctx: RequestContext, plan: Plan, response: web.StreamResponse) -> None:
        """After the answer's last byte: keep what was answered, if it may be."""


class NoCache:
    def plan(self, ctx: RequestContext) -> None:
        return None

    async def serve(self, ctx: RequestContext, plan: None) -> web.StreamResponse | None:
        return None

    async def keep(self, ctx: RequestContext, plan: None, response: web.StreamResponse) -> None:
        return None


class NoAdmission:
    async def admit(self, ctx: RequestContext) -> None:
        return None


class NoQueue:
    def slot(self, ctx: RequestContext,
             target: ModelTarget) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


def route_targets_in_order(ctx: RequestContext) -> Sequence[ModelTarget]:
    """Stand-in router: the route's targets in the order written (disabled backends are
    already gone from the runtime policy), or the one `backend/model` named directly."""
    policy, model = ctx.policy, ctx.record.requested_model
    route = policy.routes.get(model)
    if route is not None:
        return [policy.targets[key] for key in route.targets if key in policy.targets]
    target = policy.targets.get(model)
    if target is None:
        raise ModelNotFound(f"The model '{model}' does not exist.", param="model")
    return [target]
