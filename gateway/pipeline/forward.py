"""The forward step: the candidates in order, each attempt through its queue slot, the
upstream call and the relay; retries of one target and fallback to the next while
nothing has reached the client. A part of `Pipeline` (`steps.py`), kept apart because
it is the one step with a loop of its own."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from gateway.core.attempt_facts import Attempt
from gateway.core.context import RequestContext
from gateway.core.deadline import DEADLINE_HEADER, Deadline
from gateway.core.errors import BadRequest
from gateway.core.failures import UpstreamFailure
from gateway.core.log_text import escaped
from gateway.pipeline.outcome import deadline_exceeded, exhausted
from gateway.pipeline.queue_wait import QueuedSlot
from gateway.pipeline.relay import relay_body, relay_stream
from gateway.pipeline.retries import RetryPolicy
from gateway.plugin import Hooks
from gateway.queueing.slot_hook import BackendSaturated
from gateway.telemetry.service import Telemetry
from gateway.upstream.openai import PRIORITY_HEADER
from gateway.upstream.pool import Upstream, UpstreamPool
from policies.load import ModelTarget

log = logging.getLogger("routegate.pipeline")


class Forwarding:
    """What the forward step uses of the pipeline: set by `Pipeline.__init__`."""

    pool: UpstreamPool
    hooks: Hooks
    telemetry: Telemetry
    retries: RetryPolicy

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        failures: list[UpstreamFailure] = []
        unavailable: list[str] = []
        saturated: list[BackendSaturated] = []  # refused by a full queue, at no cost
        # refused by an adapter whose API cannot express the request (`n` > 1 for an
        # Anthropic backend) as it prepared the body: before any queue slot, span or
        # attempt, and another candidate may serve it
        inexpressible: list[BadRequest] = []
        deadline, late = ctx.deadline, []  # fallbacks predicted not to fit what is left
        record = ctx.record
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
                        stream_usage=record.stream and not record.client_wants_usage,
                        priority=record.priority)
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
            raise BackendSaturated.for_all(record.requested_model, saturated, unavailable)
        if inexpressible and not failures:  # no candidate could take the request as sent
            raise inexpressible[0]
        raise exhausted(ctx, failures, unavailable)

    async def attempt(self, ctx: RequestContext, target: ModelTarget, upstream: Upstream,
                      path: str, body: bytes) -> web.StreamResponse | UpstreamFailure:
        """One try on `target`: its queue slot, the upstream call and the relay. Returns
        the response, or the failure when nothing reached the client (the caller may try
        again or move on); raises `BackendSaturated` when the queue refused it at the door."""
        deadline = ctx.deadline
        # Entered and left by hand, not through an AsyncExitStack (measurably cheaper):
        # a refusal at the door moves on to the next candidate at no cost.
        telemetry, record, timing = self.telemetry, ctx.record, ctx.timing
        held = QueuedSlot(record, timing, target.backend_name,
                          telemetry.metrics.queue_depth_of(target.backend_name),
                          self.hooks.queue.slot(ctx, target))
        await held.__aenter__()
        try:
            # starts the upstream clock; this attempt's traceparent into the headers
            attempt = ctx.attempt = Attempt.start(
                record, target, timing, telemetry.metrics.in_flight_of(target.backend_name),
                ctx.upstream_headers, telemetry.new_span_id)
            timeouts = None
            if deadline is not None:  # after the queue: its wait came out of the budget
                now = timing.clock()
                timeouts = deadline.attempt_timeouts(target.backend.timeouts, now)
                left = deadline.header_value(now)
                if left is not None:
                    ctx.upstream_headers[DEADLINE_HEADER] = left
                    attempt.left_ms(int(left))
            band = upstream.band_header(record.priority)  # dedicated backends' schedulers
            if band is not None:
                ctx.upstream_headers[PRIORITY_HEADER] = band
            else:
                ctx.upstream_headers.pop(PRIORITY_HEADER, None)
            result: web.StreamResponse | UpstreamFailure
            try:
                response = await upstream.open(path, body, ctx.upstream_headers, timeouts)
                attempt.responded(response.headers, response.status)
                if record.stream and response.content_type == "text/event-stream":
                    result = await relay_stream(ctx, attempt, response)
                else:
                    result = await relay_body(ctx, attempt, response)
            except UpstreamFailure as failure:
                attempt.failure = failure
                attempt.deadline_cut = deadline is not None and failure.timed_out \
                    and deadline.cut_short(timing.clock())
                attempt.failed(failure.message, failure.status, failure.metric_reason)
                for observer in self.hooks.observers:
                    observer.attempt_finished(ctx, attempt)
                log.info("request %s: %s failed (%s)", ctx.record.request_id, target.key,
                         escaped(failure.message))  # may quote the backend
                result = failure
        except BaseException as exc:
            await held.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await held.__aexit__(None, None, None)
        if not isinstance(result, UpstreamFailure):
            broke = attempt.failure  # mid-stream, after bytes reached the client
            attempt.deadline_cut = broke is not None and deadline is not None \
                and broke.timed_out and deadline.cut_short(timing.clock())
            attempt.end()
            for observer in self.hooks.observers:
                observer.attempt_finished(ctx, attempt)
        return result


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
