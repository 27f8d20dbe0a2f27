"""The one path every proxied request takes, as small named steps on a `RequestContext`.

    begin           request id, timing, the policy this request runs under
    authenticate    API key → tenant                              (gateway.core.auth)
    read_body       size limit (Content-Length first, then the actual bytes)
    parse           orjson once (nesting bounded: MAX_JSON_DEPTH); validate the fields
                    we need; model must exist
                    (an endpoint's `dialect` — Anthropic Messages — becomes a chat body
                    here, and its stream is re-encoded as it is written back)
    admit           hooks.admission.admit       ← rate limits   (gateway/limits)
    route           hooks.router                ← routing.decide (ordered candidates)
    cache           hooks.cache.serve           ← a kept answer, and no backend call
    forward         per candidate: hooks.queue.slot ← queueing; upstream call; relay
                    fallback to the next candidate on connect errors, timeouts, 429 and
                    5xx, while no byte has reached the client (hooks.max_attempts), and
                    past a backend whose API cannot express the request (a 400 if none can)
    settle          hooks.admission.settle      (always, once admitted; the record's usage)
    keep            hooks.cache.keep            (an answer the route's cache may keep)
    answer          a dialect's whole answer re-encoded (Messages, Responses), so the
                    status recorded is the one the client gets
    finish          hooks.observers; telemetry.finish(record): metrics, access log,
                    dashboard sample and spans, all from the request record

Observers are told `request_started`, `attempt_finished` after each try and
`request_finished` at the very end (status, usage and error are final by then).

Facts go into the request record as they are learnt (`ctx.record`: what was asked
for, the status, the error's code); the context holds the live objects only
(`gateway/core/context.py`).
"""

from __future__ import annotations

import asyncio
import logging
from random import getrandbits

import orjson
from aiohttp import web

from gateway.core.auth import TENANT_HEADER, Authenticator
from gateway.core.context import Body, Endpoint, RequestContext
from gateway.core.deadline import Deadline, budgets_ms
from gateway.core.errors import (
    TIMING_KEY,
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    log_error,
)
from gateway.core.hooks import Admitted
from gateway.core.live_policy import LivePolicy
from gateway.core.whole_response import WholeResponse
from gateway.pipeline.forward import Forwarding
from gateway.pipeline.relay import CLIENT_CLOSED
from gateway.pipeline.request_body import json_object, model_name, read_limited
from gateway.pipeline.request_facts import note_decision, note_request
from gateway.pipeline.retries import RetryPolicy
from gateway.plugin import Hooks
from gateway.queueing.slot_hook import priority_of
from gateway.telemetry.service import Telemetry
from gateway.upstream.pool import UpstreamPool
from policies.bands import Priority
from policies.model_names import unserved_model

log = logging.getLogger("routegate.pipeline")

_TRACE_HEADERS = ("traceparent", "tracestate")


class Pipeline(Forwarding):
    def __init__(self, live: LivePolicy, pool: UpstreamPool, hooks: Hooks,
                 telemetry: Telemetry) -> None:
        self.live = live
        self.pool = pool
        self.hooks = hooks
        self.telemetry = telemetry
        self.auth = Authenticator(hooks.managed_keys)
        self.retries = RetryPolicy()

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """Answer the request, and only after its last byte is written settle it, keep
        it, tell the observers and report its record: none of them delays the answer."""
        ctx = self.begin(request, endpoint)
        for observer in self.hooks.observers:
            observer.request_started(ctx)
        admitted: Admitted | None = None
        kept: tuple[object, web.StreamResponse] | None = None  # (cache plan, answer)
        try:
            try:
                admitted = await self.admit(ctx)
                response, kept = await self.respond(ctx)
            except GatewayError as exc:
                response = self.refused(ctx, exc)
            await self.send(ctx, response)
            return response
        except asyncio.CancelledError:
            ctx.record.status = CLIENT_CLOSED
            raise
        except BaseException:
            if not ctx.bytes_sent:
                ctx.record.status = 0  # an unexpected exception, which the middleware answers
            raise
        finally:
            await self.finish(ctx, admitted, kept)

    async def admit(self, ctx: RequestContext) -> Admitted | None:
        record = ctx.record
        with record.step("routegate.auth"):
            self.authenticate(ctx)
        identity = ctx.identity
        record.tenant, record.auth = identity.tenant, identity.auth
        record.priority = self.priority(ctx, identity.tenant)
        await self.read_body(ctx)
        body = json_object(ctx.raw)
        dialect = ctx.endpoint.dialect
        if dialect is not None:  # e.g. an Anthropic Messages request, as a chat completion
            body = await dialect.request(ctx, body)
            ctx.raw = orjson.dumps(body)
        self.parse(ctx, body)
        with record.step("routegate.rate_limit"):
            return await self.hooks.admission.admit(ctx)

    async def respond(self, ctx: RequestContext,
                      ) -> tuple[web.StreamResponse, tuple[object, web.StreamResponse] | None]:
        """The answer, kept by the cache or from a backend (a stream is written as it
        arrives; a whole answer in the endpoint's own API), and for a route with a cache
        its plan and the answer as the backend gave it, to keep."""
        with ctx.record.step("routegate.route"):
            self.route(ctx)
            note_decision(ctx.record, ctx.record.requested_model, ctx.candidates,
                          ctx.decision)
        cache = self.hooks.cache
        plan = cache.plan(ctx)  # None (most routes): no cache step at all
        cached = await cache.serve(ctx, plan) if plan is not None else None
        response = cached if cached is not None else await self.forward(ctx)
        record = ctx.record
        if not record.status:  # a stream's is set as its head is written
            record.status = response.status
        kept = (plan, response) if plan is not None else None
        dialect = ctx.endpoint.dialect
        if dialect is not None and isinstance(response, WholeResponse) and not response.prepared:
            response = await dialect.whole_answer(response)
            record.status = response.status
        return response, kept

    def refused(self, ctx: RequestContext, exc: GatewayError) -> WholeResponse:
        """The error as the client's API writes it, with this request's headers."""
        # Its traceback and cause hold the frames of the steps that raised it, and they
        # the context, which refers back to it: a cycle only the collector would free.
        exc.__traceback__ = exc.__cause__ = exc.__context__ = None
        ctx.error = exc
        record = ctx.record
        record.status, record.error_code = exc.status, exc.code
        exc.headers.setdefault("X-Request-Id", record.request_id)
        for name, value in ctx.response_headers.items():
            exc.headers.setdefault(name, value)
        if not record.attempts:  # refused before any attempt: a limit or a shed?
            record.rejection, record.rejected_limit = exc.rejection, exc.rejected_limit
        log_error(log, ctx.request, exc)
        render = ctx.endpoint.errors
        return render(exc) if render is not None else exc.to_response()

    @staticmethod
    async def send(ctx: RequestContext, response: web.StreamResponse) -> None:
        """Write a whole response now (a stream was written as it was relayed)."""
        if not response.prepared:
            response.headers["Server-Timing"] = ctx.timing.server_timing()
            try:
                await response.prepare(ctx.request)
                await response.write_eof()
            except ConnectionResetError:  # the client went away before it had it all
                ctx.record.status = CLIENT_CLOSED
                return
        if ctx.error is not None and ctx.error.ends_connection:
            # the client stopped sending: close rather than linger reading what is left
            ctx.request.protocol.force_close()

    async def finish(self, ctx: RequestContext, admitted: Admitted | None,
                     kept: tuple[object, web.StreamResponse] | None) -> None:
        """After the last byte (or the disconnect): settlement, the cache, observers and
        the record's reporters, each once."""
        record = ctx.record
        if not record.status:  # an unexpected exception, which the middleware answers
            record.status = 500
        try:
            if admitted is not None:
                await admitted.settle(ctx)
            if kept is not None:
                await self.hooks.cache.keep(ctx, *kept)
        finally:
            for observer in self.hooks.observers:
                observer.request_finished(ctx)
            if ctx.attempt is not None:  # a disconnect or an error may leave it open
                ctx.attempt.end()
            self.telemetry.finish(record)

    def begin(self, request: web.Request, endpoint: Endpoint) -> RequestContext:
        policy, timing = self.live.current, request[TIMING_KEY]
        request_id = f"{getrandbits(96):024x}"  # unique, not secret: no system call
        record = self.telemetry.begin(
            request_id=request_id, method=request.method, path=request.path,
            headers=request.headers, timings=timing, client=request.remote,
            record_content=policy.file.compliance.record_content)
        return RequestContext(request=request, endpoint=endpoint, policy=policy, timing=timing,
                              record=record)

    def priority(self, ctx: RequestContext, tenant: str) -> Priority:
        """The band the request queues in, here and in a dedicated backend's engine."""
        return priority_of(ctx, tenant)

    def authenticate(self, ctx: RequestContext) -> None:
        ctx.identity = identity = self.auth.authenticate(ctx.request, ctx.policy)
        ctx.response_headers[TENANT_HEADER] = identity.tenant

    async def read_body(self, ctx: RequestContext) -> None:
        server = ctx.policy.file.server
        ctx.raw = await read_limited(ctx.request, server.max_body_bytes,
                                     server.body_read_timeout_s)

    def parse(self, ctx: RequestContext, body: Body) -> None:
        """The body, parsed (and translated by the endpoint's dialect): checked, and what
        it asks for written into the record."""
        ctx.body = body
        model = model_name(body)
        ctx.endpoint.check(body)
        caller = ctx.identity
        tenant, key_hash = caller.tenant, caller.key_hash
        policy = ctx.policy
        served = policy.usable(model, tenant, key_hash)
        if served is None:
            unserved = unserved_model(policy, model, policy.access_of(tenant, key_hash))
            raise ModelNotFound(unserved.message, param="model",
                                code="model_disabled" if unserved.disabled else None)
        self.refuse_unless_a_backend_is_up(ctx, model, served)
        record = ctx.record
        record.served_model = served
        note_request(record, ctx.endpoint.name, model, body.get("stream") is True, body)
        options = body.get("stream_options")
        record.client_wants_usage = bool(options and options.get("include_usage") is True)
        headers = ctx.request.headers
        ctx.upstream_headers["X-Request-Id"] = ctx.record.request_id
        for name in _TRACE_HEADERS:
            if name in headers:
                ctx.upstream_headers[name] = headers[name]

    def refuse_unless_a_backend_is_up(self, ctx: RequestContext, model: str,
                                      served: str) -> None:
        """A request none of whose backends is up (a launched one still starting) is
        refused before it is admitted, so it costs the caller nothing of its limits."""
        policy, pool = ctx.policy, self.pool
        route = policy.routes.get(served)
        keys = route.targets if route is not None else (served,)
        for key in keys:
            target = policy.targets[key]
            if pool.is_up(target.backend_name, target.backend):
                return
        raise NoBackendAvailable(f"No backend can serve '{model}': " + "; ".join(
            f"{key}: {pool.unavailable_reason(policy.targets[key].backend_name)}"
            for key in keys) + ".")

    def route(self, ctx: RequestContext) -> None:
        # an Anthropic backend has no /embeddings: routing never picks what cannot serve
        ctx.candidates = self.pool.serving(ctx.endpoint.path, self.hooks.router(ctx))
        if not ctx.candidates:
            raise NoBackendAvailable(f"No backend can serve '{ctx.record.requested_model}' now.")
        ctx.deadline = self.deadline(ctx)

    @staticmethod
    def deadline(ctx: RequestContext) -> Deadline | None:
        """From the budgets routing read (or, with no router of ours, the route's)."""
        decision = ctx.decision
        if decision is not None:
            features = decision.features
            ttft_ms, total_ms = features.ttft_budget_ms, features.total_budget_ms
        else:
            ttft_ms, total_ms = budgets_ms(ctx.policy, ctx.record.served_model,
                                           ctx.request.headers)
        return Deadline.of(ctx.timing.start, ttft_ms, total_ms)
