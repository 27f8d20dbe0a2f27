"""Routing in the pipeline: `hooks.router` from `routing.decide`, and the stats it learns from.

    route step      features (tokens, PII, budget) → Router.decide → ordered candidates;
                    a rejection becomes the client's error (403 / 503 naming why);
                    PII under `redact` is replaced in the body before it goes upstream
    each attempt    the target's queue depth (waiting in the gateway's queue) and
                    in-flight count (sent), so predictions see the load this process
                    puts on it
    after attempt   TTFT, decode rate and errors into `LiveStats`; the prediction error
                    as a metric;
                    connect errors, timeouts and 5xx in a row eject the target
                    (`routing.outliers`, the one health model), and the first attempt
                    after an ejection is its probe; a 429 is an answer (never a
                    failure), its `Retry-After` a predicted wait; an attempt the
                    request's own deadline cut short counts neither way (the gateway's
                    limit, not the target's fault)
    every response  `x-routegate-route` (the backend/model that answered or was tried
                    last) and `x-routegate-decision` (the decision id), through the
                    request's `response_headers`

A `Router` is compiled once per policy; a reload builds the next one on the first
request that runs under the new policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from random import random
from time import monotonic
from typing import Any

import orjson
from aiohttp import web

from gateway.core.attempt_facts import Attempt
from gateway.core.context import RequestContext
from gateway.core.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    RateLimited,
)
from gateway.core.failures import RateLimited as BackendRateLimited
from gateway.core.hooks import QueueSlots
from gateway.telemetry.metrics import GatewayMetrics
from policies.capabilities import ModelCapabilities
from policies.load import ModelTarget, Policy
from routing.capabilities import Learned, bits_for_param
from routing.compliance import REASON_EJECTED, REASON_UNHEALTHY
from routing.decide import Rejection, RouteDecision, Router
from routing.features import FeatureError, build_features
from routing.outliers import Ejections
from routing.pii import PiiScanner
from routing.stats import LiveStats, StatsSnapshot
from routing.tokens import TokenCounter

ROUTE_HEADER = "x-routegate-route"
DECISION_HEADER = "x-routegate-decision"


@dataclass(frozen=True, slots=True)
class _Compiled:
    policy: Policy
    router: Router
    pii: PiiScanner


class RoutingHook:
    """`hooks.router`, an observer for stats, and the wrapper that counts in-flight."""

    def __init__(self, stats: LiveStats | None = None,
                 tokens: TokenCounter | None = None) -> None:
        self.stats = stats or LiveStats()
        self.ejections = Ejections(self.stats)
        self.tokens = tokens or TokenCounter()
        self._compiled: _Compiled | None = None
        # what launched backends said they can do, by backend name (kept across reloads:
        # the child is the same); what backends answered they cannot, under one policy
        self.reported: dict[str, ModelCapabilities] = {}
        self.learned = Learned()
        self._learned_under: Policy | None = None
        # the app's metrics (ejections, prediction errors), set as the app starts
        self.metrics: GatewayMetrics | None = None
        # share of the prompt each fleet target likely holds (`replica_call.py`), if any
        self.cached_share: Callable[[RequestContext], Mapping[str, float] | None] | None = None

    def _for(self, policy: Policy) -> _Compiled:
        compiled = self._compiled
        if compiled is None or compiled.policy is not policy:
            if self._learned_under is not policy:  # a reload forgets what was learned
                self.learned, self._learned_under = Learned(), policy
            reported = {key: self.reported[target.backend_name]
                        for key, target in policy.targets.items()
                        if target.backend_name in self.reported}
            compiled = _Compiled(policy, Router(policy, reported, self.learned),
                                 PiiScanner(policy.file.compliance.pii.detect))
            self._compiled = compiled
        return compiled

    def sole_targets(self, policy: Policy) -> dict[str, list[str]]:
        """Targets that are some tenant's only compliant one on a route (`Router.sole_targets`)."""
        return self._for(policy).router.sole_targets()

    def backend_reported(self, backend: str, capabilities: ModelCapabilities | None) -> None:
        """A launched backend's self-description (None: it gave none); the next
        decision uses it."""
        if capabilities is None:
            self.reported.pop(backend, None)
        else:
            self.reported[backend] = capabilities
        self._compiled = None

    def _learn(self, ctx: RequestContext, attempt: Attempt) -> None:
        cannot = attempt.failure.cannot if attempt.failure is not None else None
        decision = ctx.decision
        if cannot is None or not isinstance(decision, RouteDecision) or \
                ctx.policy is not self._learned_under:
            return
        key, features = attempt.target.key, decision.features
        if cannot.context_exceeded:
            changed = self.learned.overflowed(
                key, features.input_tokens + features.output_tokens)
        else:
            changed = self.learned.lack(key, bits_for_param(cannot.param) & features.needs)
        if changed:
            self._compiled = None

    # -- hooks.router ----------------------------------------------------------

    def __call__(self, ctx: RequestContext) -> Sequence[ModelTarget]:
        compiled = self._for(ctx.policy)
        caller = ctx.identity
        tenant = caller.tenant
        stats = self.stats.snapshot()
        try:
            features = build_features(
                ctx.body, ctx.request.headers, ctx.policy, tenant, tokens=self.tokens,
                pii=compiled.pii, stats=stats,
                tenant_budget_left_micro_usd=ctx.record.budget_left_micros,
                input_tokens=ctx.record.estimated_input_tokens,
                key_hash=caller.key_hash)
        except FeatureError as exc:
            if exc.not_found:
                raise ModelNotFound(str(exc), param=exc.param) from exc
            raise BadRequest(str(exc), param=exc.param) from exc
        if self.cached_share is not None:
            features.cached_share = self.cached_share(ctx)
        # the draws a route's `spread` picks with (routing has no random source)
        decision = compiled.router.decide(features, stats, monotonic(),
                                          decision_id=ctx.record.request_id,
                                          draws=(random(), random()))
        ctx.decision = decision
        ctx.response_headers[DECISION_HEADER] = decision.decision_id
        if decision.rejection is not None:
            raise _error(decision.rejection, _back_in_s(decision, stats, monotonic()))
        if decision.redact:
            # The upstream gets the redacted body; the client's bytes never leave.
            redacted, _ = compiled.pii.redact_body(ctx.body)
            ctx.body, ctx.raw = redacted, orjson.dumps(redacted)
        return [candidate.target for candidate in decision.candidates]

    # -- hooks.queue wrapper: in-flight per target -------------------------------

    def counting(self, inner: QueueSlots) -> QueueSlots:
        return _CountingSlots(inner, self)

    # -- observer ------------------------------------------------------------------

    def request_started(self, ctx: RequestContext) -> None:
        return None

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        decision = ctx.decision
        if decision is None:
            return
        key = attempt.target.key
        now = monotonic()
        if attempt.deadline_cut:
            # the request's own budget ran out while the target worked on it: that says
            # nothing of the target's health (a slow start must not eject the only
            # target a tenant may use); its latency is learnt from the answers it gives
            return
        # the failure's kind says whether it was the target's fault (a connect error,
        # a timeout, a 5xx) or an answer (a 429, the gateway's key refused)
        failure = attempt.failure
        broken = failure is not None and failure.counts_against_health
        changed = (self.ejections.failed(key, now, ctx.policy.file.resilience.outlier_detection)
                   if broken else self.ejections.succeeded(key, now))
        if changed and self.metrics is not None:
            self.metrics.observe_ejection(
                attempt.target.backend_name, attempt.target.model_name, ejected=broken)
        if failure is not None and failure.cannot is not None:  # a capability it lacks
            self._learn(ctx, attempt)
            return
        if broken:
            assert failure is not None
            self.stats.record_error(key, now, retry_after_s=failure.retry_after_s)
            return
        if failure is not None:
            if isinstance(failure, BackendRateLimited):  # busy, not broken: a wait
                self.stats.record_busy(key, now, retry_after_s=failure.retry_after_s)
            return
        timing = ctx.timing
        started = timing.attempt_started_s
        if started is None:
            return
        total_ms = (timing.clock() - started) * 1000.0
        ttft_ms = network_ms = None
        request_ttft_ms = timing.ttft_ms
        if request_ttft_ms is not None:  # a stream: first content token relayed
            # The request's TTFT counts from its arrival; the backend's from the attempt.
            ttft_ms = max(0.0, request_ttft_ms - (started - timing.start) * 1000.0)
            # An SSE server sends its headers before prefill: a fair round trip.
            network_ms = timing.upstream_first_byte_ms
        output = ctx.record.output_tokens or 0  # as the backend reported them
        candidate = decision.candidate(key)
        error = self.stats.record_success(
            key, network_ms=network_ms, ttft_ms=ttft_ms, total_ms=total_ms,
            output_tokens=output,
            explained_ttft_ms=candidate.explained_ttft_ms if candidate else None,
            predicted_ttft_ms=candidate.ttft_ms if candidate and ttft_ms is not None else None,
            predicted_total_ms=candidate.total_ms if candidate else None)
        if self.metrics is not None:
            self.metrics.observe_prediction_error(
                attempt.target.backend_name, attempt.target.model_name,
                ttft_ms=error.ttft_ms, total_ms=error.total_ms)
        if output:
            self.stats.record_output_tokens(decision.route, output)

    def request_finished(self, ctx: RequestContext) -> None:
        return None


class _CountingSlots:
    """Counts an attempt against its target from the moment it queues for it until its
    response is relayed, around whatever queue the app uses."""

    def __init__(self, inner: QueueSlots, hook: RoutingHook) -> None:
        self.inner = inner
        self.hook = hook

    def slot(self, ctx: RequestContext,
             target: ModelTarget) -> AbstractAsyncContextManager[None]:
        return _CountedSlot(self.hook, self.inner.slot(ctx, target), ctx, target)


class _CountedSlot:
    """One attempt's count around the inner slot (a class: an @asynccontextmanager
    generator per request cost a few µs)."""

    __slots__ = ("_ctx", "_hook", "_inner", "_stats", "_target")

    def __init__(self, hook: RoutingHook, inner: AbstractAsyncContextManager[None],
                 ctx: RequestContext, target: ModelTarget) -> None:
        self._hook, self._stats, self._inner = hook, hook.stats, inner
        self._ctx, self._target = ctx, target

    async def __aenter__(self) -> None:
        ctx, target = self._ctx, self._target
        self._stats.request_queued(target.key)  # routing's `queue_depth` until it has a slot
        try:
            await self._inner.__aenter__()
        except BaseException:
            self._stats.request_left_queue(target.key)
            raise
        self._stats.request_started(target.key, queued=True)
        self._hook.ejections.attempt_started(
            target.key, monotonic(), ctx.policy.file.resilience.outlier_detection)
        ctx.response_headers[ROUTE_HEADER] = target.key  # tried last, or answered

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: Any) -> bool | None:
        try:
            return await self._inner.__aexit__(kind, exc, traceback)
        finally:
            self._stats.request_finished(self._target.key)


def _error(rejection: Rejection, back_in_s: float | None) -> GatewayError:
    if rejection.status == 400:
        return BadRequest(rejection.message, param=rejection.param, code=rejection.code)
    if rejection.status == 403:
        return Forbidden(rejection.message, code=rejection.code)
    if rejection.status == 404:
        return ModelNotFound(rejection.message, param="model")
    if rejection.status == 429:
        return RateLimited(rejection.message, code=rejection.code)
    headers = {} if back_in_s is None else {"Retry-After": str(max(1, math.ceil(back_in_s)))}
    return NoBackendAvailable(rejection.message, code=rejection.code, headers=headers)


def _back_in_s(decision: RouteDecision, stats: StatsSnapshot, now: float) -> float | None:
    """Seconds until the first candidate left out as unhealthy or ejected is tried again
    (never before its backend's own `Retry-After`); None when none was left out for
    that, or none has a known time (a backend down until its checks pass)."""
    times = [back for excluded in decision.excluded if excluded.reason == REASON_UNHEALTHY
             if (back := stats.target(excluded.key).back_at()) is not None]
    times += [stats.ejected[excluded.key] for excluded in decision.excluded
              if excluded.reason == REASON_EJECTED and excluded.key in stats.ejected]
    times = [back for back in times if math.isfinite(back)]
    return min(times) - now if times else None


ROUTING = web.AppKey("routegate.routing", RoutingHook)
