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
    settle          hooks.admission.settle      (always, once admitted; ctx.usage)
    keep            hooks.cache.keep            (an answer the route's cache may keep)
    answer          a dialect's whole answer re-encoded (Messages, Responses), so the
                    status recorded is the one the client gets
    finish          hooks.observers; telemetry.finish(record): metrics, access log,
                    dashboard sample and spans, all from the request record

Observers are told `request_started`, `attempt_finished` after each try and
`request_finished` at the very end (status, usage and error are final by then).
"""

from __future__ import annotations

import asyncio
import logging
from random import getrandbits

import orjson
from aiohttp import web

from gateway.core.attempt_facts import AttemptFacts
from gateway.core.auth import TENANT_HEADER, Authenticator
from gateway.core.context import Attempt, Endpoint, RequestContext
from gateway.core.deadline import DEADLINE_HEADER, Deadline, budgets_ms
from gateway.core.errors import (
    TIMING_KEY,
    BadRequest,
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    log_error,
)
from gateway.core.failures import UpstreamFailure
from gateway.core.hooks import Admitted
from gateway.core.live_policy import LivePolicy
from gateway.core.log_text import escaped
from gateway.core.whole_response import WholeResponse
from gateway.pipeline.outcome import deadline_exceeded, exhausted
from gateway.pipeline.queue_wait import QueuedSlot
from gateway.pipeline.relay import CLIENT_CLOSED, relay_body, relay_stream
from gateway.pipeline.request_body import json_object, model_name, read_limited
from gateway.pipeline.request_facts import note_decision, note_request
from gateway.pipeline.retries import RetryPolicy
from gateway.plugin import Hooks
from gateway.queueing.slot_hook import BackendSaturated, priority_of
from gateway.telemetry.service import Telemetry
from gateway.upstream.openai import PRIORITY_HEADER
from gateway.upstream.pool import Upstream, UpstreamPool
from policies.bands import Priority
from policies.load import ModelTarget
from policies.model_names import unserved_model

log = logging.getLogger("routegate.pipeline")

_TRACE_HEADERS = ("traceparent", "tracestate")


class Pipeline:
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
            ctx.status = CLIENT_CLOSED
            raise
        except BaseException:
            if not ctx.bytes_sent:
                ctx.status = None  # an unexpected exception, which the middleware answers
            raise
        finally:
            await self.finish(ctx, admitted, kept)

    async def admit(self, ctx: RequestContext) -> Admitted | None:
        record = ctx.record
        with record.step("routegate.auth"):
            self.authenticate(ctx)
        identity = ctx.caller
        record.tenant, record.auth = identity.tenant, identity.auth
        record.priority = self.priority(ctx, identity.tenant)
        await self.read_body(ctx)
        await self.parse(ctx)
        note_request(record, ctx.endpoint.name, ctx.model, ctx.stream, ctx.body)
        with record.step("routegate.rate_limit"):
            return await self.hooks.admission.admit(ctx)

    async def respond(self, ctx: RequestContext,
                      ) -> tuple[web.StreamResponse, tuple[object, web.StreamResponse] | None]:
        """The answer, kept by the cache or from a backend (a stream is written as it
        arrives; a whole answer in the endpoint's own API), and for a route with a cache
        its plan and the answer as the backend gave it, to keep."""
        with ctx.record.step("routegate.route"):
            self.route(ctx)
            note_decision(ctx.record, ctx.model, ctx.candidates, ctx.decision)
        cache = self.hooks.cache
        plan = cache.plan(ctx)  # None (most routes): no cache step at all
        cached = await cache.serve(ctx, plan) if plan is not None else None
        response = cached if cached is not None else await self.forward(ctx)
        ctx.status = response.status if ctx.status is None else ctx.status
        kept = (plan, response) if plan is not None else None
        dialect = ctx.endpoint.dialect
        if dialect is not None and isinstance(response, WholeResponse) and not response.prepared:
            response = await dialect.whole_answer(response)
            ctx.status = response.status
        return response, kept

    def refused(self, ctx: RequestContext, exc: GatewayError) -> WholeResponse:
        """The error as the client's API writes it, with this request's headers."""
        # Its traceback and cause hold the frames of the steps that raised it, and they
        # the context, which refers back to it: a cycle only the collector would free.
        exc.__traceback__ = exc.__cause__ = exc.__context__ = None
        ctx.error, ctx.status = exc, exc.status
        exc.headers.setdefault("X-Request-Id", ctx.request_id)
        for name, value in ctx.response_headers.items():
            exc.headers.setdefault(name, value)
        record = ctx.record
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
                ctx.status = CLIENT_CLOSED
                return
        if ctx.error is not None and ctx.error.ends_connection:
            # the client stopped sending: close rather than linger reading what is left
            ctx.request.protocol.force_close()

    async def finish(self, ctx: RequestContext, admitted: Admitted | None,
                     kept: tuple[object, web.StreamResponse] | None) -> None:
        """After the last byte (or the disconnect): settlement, the cache, observers and
        the record's reporters, each once."""
        record = ctx.record
        try:
            if admitted is not None:
                await admitted.settle(ctx)
            if kept is not None:
                await self.hooks.cache.keep(ctx, *kept)
        finally:
            for observer in self.hooks.observers:
                observer.request_finished(ctx)
            if ctx.facts is not None:  # a disconnect or an error may leave it open
                ctx.facts.end()
            # no status: an unexpected exception, which the middleware answers with a 500
            record.status = ctx.status if ctx.status is not None else 500
            record.error_code = ctx.error.code if ctx.error is not None else None
            self.telemetry.finish(record)

    def begin(self, request: web.Request, endpoint: Endpoint) -> RequestContext:
        policy, timing = self.live.current, request[TIMING_KEY]
        request_id = f"{getrandbits(96):024x}"  # unique, not secret: no system call
        record = self.telemetry.begin(
            request_id=request_id, method=request.method, path=request.path,
            headers=request.headers, timings=timing, client=request.remote,
            record_content=policy.file.compliance.record_content)
        return RequestContext(request=request, endpoint=endpoint, policy=policy, timing=timing,
                              request_id=request_id, record=record)

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

    async def parse(self, ctx: RequestContext) -> None:
        body = json_object(ctx.raw)
        dialect = ctx.endpoint.dialect
        if dialect is not None:  # e.g. an Anthropic Messages request, as a chat completion
            body = await dialect.request(ctx, body)
            ctx.raw = orjson.dumps(body)
        ctx.body = body
        ctx.model = model_name(body)
        ctx.endpoint.check(body)
        caller = ctx.caller
        tenant, key_hash = caller.tenant, caller.key_hash
        served = ctx.policy.usable(ctx.model, tenant, key_hash)
        if served is None:
            unserved = unserved_model(ctx.policy, ctx.model, ctx.policy.access_of(tenant, key_hash))
            raise ModelNotFound(unserved.message, param="model",
                                code="model_disabled" if unserved.disabled else None)
        self.refuse_unless_a_backend_is_up(ctx, served)
        ctx.stream = body.get("stream") is True
        options = body.get("stream_options")
        ctx.client_wants_usage = bool(options and options.get("include_usage") is True)
        headers = ctx.request.headers
        ctx.upstream_headers["X-Request-Id"] = ctx.request_id
        for name in _TRACE_HEADERS:
            if name in headers:
                ctx.upstream_headers[name] = headers[name]

    def refuse_unless_a_backend_is_up(self, ctx: RequestContext, served: str) -> None:
        """A request none of whose backends is up (a launched one still starting) is
        refused before it is admitted, so it costs the caller nothing of its limits."""
        policy, pool = ctx.policy, self.pool
        route = policy.routes.get(served)
        keys = route.targets if route is not None else (served,)
        for key in keys:
            target = policy.targets[key]
            if pool.is_up(target.backend_name, target.backend):
                return
        raise NoBackendAvailable(f"No backend can serve '{ctx.model}': " + "; ".join(
            f"{key}: {pool.unavailable_reason(policy.targets[key].backend_name)}"
            for key in keys) + ".")

    def route(self, ctx: RequestContext) -> None:
        # an Anthropic backend has no /embeddings: routing never picks what cannot serve
        ctx.candidates = self.pool.serving(ctx.endpoint.path, self.hooks.router(ctx))
        if not ctx.candidates:
            raise NoBackendAvailable(f"No backend can serve '{ctx.model}' now.")
        ctx.deadline = self.deadline(ctx)

    @staticmethod
    def deadline(ctx: RequestContext) -> Deadline | None:
        """From the budgets routing read (or, with no router of ours, the route's)."""
        decision = ctx.decision
        if decision is not None:
            features = decision.features
            ttft_ms, total_ms = features.ttft_budget_ms, features.total_budget_ms
        else:
            ttft_ms, total_ms = budgets_ms(ctx.policy, ctx.policy.resolve_model(
                ctx.model, ctx.caller.tenant), ctx.request.headers)
        return Deadline.of(ctx.timing.start, ttft_ms, total_ms)

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        failures: list[UpstreamFailure] = []
        unavailable: list[str] = []
        saturated: list[BackendSaturated] = []  # refused by a full queue, at no cost
        # refused by an adapter whose API cannot express the request (`n` > 1 for an
        # Anthropic backend) as it prepared the body: before any queue slot, span or
        # attempt, and another candidate may serve it
        inexpressible: list[BadRequest] = []
        deadline, late = ctx.deadline, []  # fallbacks predicted not to fit what is left
        retry_settings = ctx.policy.file.resilience.retries
        self.retries.requested(retry_settings)
        tried = 0
        dialect = ctx.endpoint.dialect
        for index, target in enumerate(ctx.candidates):
            if tried >= self.hooks.max_attempts:
                break
            if deadline is not None:
                if deadline.passed(ctx.timing.clock()):
                    break
                misfit = _misfit(ctx, deadline, target.key) if index else None
                if misfit is not None:
                    late.append(f"{target.key}: {misfit}")
                    continue
            upstream = self.pool.get(target.backend_name, target.backend)
            if upstream is not None and self.hooks.replicas is not None:
                upstream = self.hooks.replicas.choose(ctx, target, upstream)
            if upstream is None:
                reason = self.pool.unavailable_reason(target.backend_name)
                unavailable.append(f"{target.key}: {reason}")
                continue
            path = ctx.endpoint.path
            try:
                native = dialect.native(target) if dialect is not None else None
                if native is not None:  # the backend speaks the client's API: as written
                    path, body = native
                else:
                    body = upstream.prepare(
                        path, ctx.raw, ctx.body, model=target.upstream_name,
                        stream_usage=ctx.stream and not ctx.client_wants_usage,
                        priority=ctx.record.priority)
            except BadRequest as refused:  # its API cannot express the request
                inexpressible.append(refused)
                unavailable.append(f"{target.key}: {refused.message}")
                continue
            tried += 1
            retried = 0
            while True:
                try:
                    outcome = await self.attempt(ctx, target, upstream, path, body)
                except BackendSaturated as refused:  # nothing sent yet: spill to the next
                    tried -= 1
                    saturated.append(refused)
                    unavailable.append(refused.message)
                    break
                if not isinstance(outcome, UpstreamFailure):
                    return outcome
                failures.append(outcome)
                wait_s = self.retries.wait_s(outcome, retried, retry_settings, deadline,
                                             ctx.timing.clock())
                if wait_s is None:
                    break
                retried += 1
                self.telemetry.metrics.observe_retry(target.backend_name)
                await asyncio.sleep(wait_s)
        if deadline is not None and (late or deadline.passed(ctx.timing.clock())):
            raise deadline_exceeded(ctx, [*unavailable, *late])
        if saturated and not failures:  # shed: 503 with the soonest Retry-After
            raise BackendSaturated.for_all(ctx.model, saturated, unavailable)
        if inexpressible and not failures:  # no candidate could take the request as sent
            raise inexpressible[0]
        raise exhausted(ctx, failures, unavailable)

    async def attempt(self, ctx: RequestContext, target: ModelTarget, upstream: Upstream,
                      path: str, body: bytes) -> web.StreamResponse | UpstreamFailure:
        """One try on `target`: its queue slot, the upstream call and the relay. Returns
        the response, or the failure when nothing reached the client (the caller may try
        again or move on); raises `BackendSaturated` when the queue refused it at the door."""
        deadline = ctx.deadline
        attempt = Attempt(target=target)
        ctx.attempts.append(attempt)
        # Entered and left by hand, not through an AsyncExitStack (measurably cheaper):
        # a refusal at the door moves on to the next candidate at no cost.
        telemetry, record = self.telemetry, ctx.record
        held = QueuedSlot(record, ctx.timing, target.backend_name,
                          telemetry.metrics.queue_depth_of(target.backend_name),
                          self.hooks.queue.slot(ctx, target))
        try:
            await held.__aenter__()
        except BackendSaturated:
            ctx.attempts.pop()
            raise
        try:
            ctx.target = target
            # starts the upstream clock; this attempt's traceparent into the headers
            facts = ctx.facts = AttemptFacts.start(
                record, target, ctx.timing, telemetry.metrics.in_flight_of(target.backend_name),
                ctx.upstream_headers, telemetry.new_span_id)
            attempt.record = facts.attempt
            timeouts = None
            if deadline is not None:  # after the queue: its wait came out of the budget
                now = ctx.timing.clock()
                timeouts = deadline.attempt_timeouts(target.backend.timeouts, now)
                left = deadline.header_value(now)
                if left is not None:
                    ctx.upstream_headers[DEADLINE_HEADER] = left
                    facts.left_ms(int(left))
            band = upstream.band_header(record.priority)  # dedicated backends' schedulers
            if band is not None:
                ctx.upstream_headers[PRIORITY_HEADER] = band
            else:
                ctx.upstream_headers.pop(PRIORITY_HEADER, None)
            result: web.StreamResponse | UpstreamFailure
            try:
                response = await upstream.open(path, body, ctx.upstream_headers, timeouts)
                facts.responded(response.headers, response.status)
                if ctx.stream and response.content_type == "text/event-stream":
                    result = await relay_stream(ctx, response)
                else:
                    result = await relay_body(ctx, response)
            except UpstreamFailure as failure:
                attempt.failure = failure
                attempt.deadline_cut = deadline is not None and failure.timed_out \
                    and deadline.cut_short(ctx.timing.clock())
                facts.failed(failure.message, failure.status, failure.metric_reason)
                self._attempt_finished(ctx, attempt)
                log.info("request %s: %s failed (%s)", ctx.request_id, target.key,
                         escaped(failure.message))  # may quote the backend
                result = failure
        except BaseException as exc:
            await held.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await held.__aexit__(None, None, None)
        if not isinstance(result, UpstreamFailure):
            broke = attempt.failure  # mid-stream, after bytes reached the client
            attempt.deadline_cut = broke is not None and deadline is not None \
                and broke.timed_out and deadline.cut_short(ctx.timing.clock())
            facts.end()
            self._attempt_finished(ctx, attempt)
        return result

    def _attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        for observer in self.hooks.observers:
            observer.attempt_finished(ctx, attempt)


def _misfit(ctx: RequestContext, deadline: Deadline, key: str) -> str | None:
    """Why the fallback `key` is predicted not to fit what is left of the budget. Not
    asked when routing chose past the budget anyway (`on_budget_miss: fastest`)."""
    decision = ctx.decision
    if decision is None or decision.budget_missed:
        return None
    for candidate in decision.candidates:
        if candidate.key == key:
            return deadline.misfit(ctx.timing.clock(), candidate.ttft_ms, candidate.total_ms)
    return None
