"""The telemetry seam of the request pipeline: one object per request.

The pipeline tells `RequestTelemetry` what happened, step by step; it keeps the
span tree, the clock marks and the facts of the request, and `finish()` turns
them into the root span's attributes, the metrics, the live dashboard sample and
the access log line — once, whatever path the request took (success, error,
client disconnect).

    tel = telemetry.begin(request_id=..., method="POST", path=..., headers=request.headers)
    with tel.step("routegate.auth"): tenant = ...
    tel.identify(tenant=..., requested_model=..., stream=...)
    with tel.step("routegate.route") as span: decision = ...; tel.routed(span, ...)
    async with tel.queue_wait(backend): await slot
    attempt = tel.upstream(backend=..., model=..., system="openai")
    attempt.inject(upstream_headers); ...; attempt.responded(resp.headers); attempt.token() ...
    attempt.end(); response.headers["Server-Timing"] = tel.server_timing()
    tel.finish(status)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, MutableMapping
from time import perf_counter
from typing import Any

from opentelemetry.trace import NoOpTracerProvider, Span, TracerProvider

from gateway.telemetry import spans as a
from gateway.telemetry.access_log import AccessLog, AccessRecord
from gateway.telemetry.inference_time import from_body, from_headers
from gateway.telemetry.live import LiveStats, Sample
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.spans import RequestTrace, clean, mark_error
from gateway.telemetry.timing import Clock, RequestTimings, TimingSplit


class UpstreamAttempt:
    """The CLIENT span and clock marks of one upstream call."""

    __slots__ = ("_ended", "_first_token", "_req", "backend", "model", "span")

    def __init__(self, req: RequestTelemetry, span: Span, backend: str, model: str) -> None:
        self._req, self.span, self.backend, self.model = req, span, backend, model
        self._first_token = False
        self._ended = False

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add `traceparent` so the backend continues this trace under this span."""
        self._req.trace.inject(self.span, headers)

    def responded(self, headers: Mapping[str, str], status: int = 200) -> None:
        """Upstream response headers arrived: first byte, and any timing they report."""
        self._req.timings.upstream_first_byte()
        self._req.timings.report(from_headers(headers))
        if self.span.is_recording():
            self.span.set_attribute(a.HTTP_RESPONSE_STATUS_CODE, status)

    def token(self) -> None:
        """A content-bearing chunk was relayed; the first one is an event on the span."""
        self._req.timings.token()
        if not self._first_token:
            self._first_token = True
            if self.span.is_recording():
                self.span.add_event(a.EVENT_FIRST_TOKEN)

    def body(self, body: Mapping[str, Any]) -> None:
        """A JSON response, or a stream's final chunk: usage and backend-reported timings."""
        self._req.timings.report(from_body(body))
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            self._req.usage(
                input_tokens=usage.get("prompt_tokens", usage.get("input_tokens")),
                output_tokens=usage.get("completion_tokens", usage.get("output_tokens")),
            )
        choices = body.get("choices")
        if isinstance(choices, list):
            reasons = [c.get("finish_reason") for c in choices if isinstance(c, Mapping)]
            self._req.finish_reasons.extend(r for r in reasons if isinstance(r, str))
        if isinstance(body.get("model"), str):
            self._req.response_model = body["model"]
        if isinstance(body.get("id"), str):
            self._req.response_id = body["id"]

    def failed(self, exc: BaseException | str) -> None:
        if isinstance(exc, BaseException):
            mark_error(self.span, exc)
        elif self.span.is_recording():
            self.span.set_attribute(a.ERROR_TYPE, exc)
        self.end()

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._req.timings.upstream_ended()
        self._req.metrics.in_flight.labels(self._req.metrics.label("backend", self.backend)).dec()
        self.span.end()


class RequestTelemetry:
    def __init__(
        self,
        telemetry: Telemetry,
        *,
        request_id: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        record_content: bool = False,
    ) -> None:
        self.metrics = telemetry.metrics
        self._telemetry = telemetry
        self.timings = RequestTimings(clock=telemetry.clock)
        self.trace = RequestTrace(
            telemetry.provider,
            name=f"{method} {path}",
            headers=headers,
            attributes={a.HTTP_REQUEST_METHOD: method, a.HTTP_ROUTE: path,
                        a.RG_REQUEST_ID: request_id},
        )
        self.request_id, self.method, self.path = request_id, method, path
        self.record_content = record_content
        self.tenant: str | None = None
        self.route: str | None = None
        self.backend: str | None = None
        self.model: str | None = None
        self.requested_model: str | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.reason: str | None = None
        self.stream = False
        self.attempts = 0
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cost_usd: float | None = None
        self.finish_reasons: list[str] = []
        self.result: TimingSplit | None = None

    @property
    def trace_id(self) -> str | None:
        return self.trace.trace_id

    # steps -----------------------------------------------------------------
    def step(
        self, name: str, attributes: Mapping[str, Any] | None = None
    ) -> contextlib.AbstractContextManager[Span]:
        """A child span around one step (`routegate.auth`, `.rate_limit`, `.route`, …)."""
        return self.trace.step(name, attributes)

    def identify(
        self,
        *,
        tenant: str | None = None,
        requested_model: str | None = None,
        stream: bool | None = None,
        operation: str = "chat",
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> None:
        if tenant is not None:
            self.tenant = tenant
        if requested_model is not None:
            self.requested_model = requested_model
        if stream is not None:
            self.stream = stream
        self.trace.set({
            a.RG_TENANT: tenant, a.GEN_AI_REQUEST_MODEL: requested_model, a.RG_STREAM: stream,
            a.GEN_AI_OPERATION_NAME: operation, a.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            a.GEN_AI_REQUEST_TEMPERATURE: temperature,
        })

    def rejected(self, kind: str, *, limit: str | None = None, priority: str = "normal") -> None:
        """Refused before an upstream call: kind = rate_limit | budget | shed."""
        if kind == "shed":
            self.metrics.observe_shed(self.backend or "", priority)
        else:
            self.metrics.observe_rejection(self.tenant or "", limit or kind)
        self._telemetry.live.rejected(kind)

    def routed(
        self,
        span: Span | None,
        *,
        route: str,
        backend: str,
        model: str,
        reason: str,
        decision_id: str | None = None,
        predicted_ttft_ms: float | None = None,
        predicted_total_ms: float | None = None,
        predicted_cost_usd: float | None = None,
        candidates: list[str] | None = None,
        excluded: list[str] | None = None,
    ) -> None:
        """The routing decision: attributes on the route span (and the root), one metric."""
        self.route, self.backend, self.model, self.reason = route, backend, model, reason
        attributes = clean({
            a.RG_ROUTE: route, a.RG_BACKEND: backend, a.RG_DECISION_REASON: reason,
            a.RG_DECISION_ID: decision_id, a.RG_PREDICTED_TTFT_MS: predicted_ttft_ms,
            a.RG_PREDICTED_TOTAL_MS: predicted_total_ms,
            a.RG_PREDICTED_COST_USD: predicted_cost_usd,
            a.RG_CANDIDATES: candidates, a.RG_EXCLUDED: excluded,
        })
        if span is not None and span.is_recording():
            span.set_attributes(attributes)
        self.trace.set(attributes)
        self.metrics.observe_decision(route, backend, reason)

    @contextlib.asynccontextmanager
    async def queue_wait(self, backend: str) -> AsyncIterator[Span]:
        """Around waiting for a backend slot: span, queue clock and queue-depth gauge."""
        gauge = self.metrics.queue_depth.labels(self.metrics.label("backend", backend))
        span = self.trace.start("routegate.queue", {a.RG_BACKEND: backend})
        self.timings.queue_started()
        gauge.inc()
        try:
            yield span
        except BaseException as exc:
            mark_error(span, exc)
            raise
        finally:
            gauge.dec()
            waited_ms = round(self.timings.queue_ended() * 1000.0, 3)
            if span.is_recording():
                span.set_attribute(a.RG_QUEUE_WAIT_MS, waited_ms)
            span.end()

    def upstream(
        self,
        *,
        backend: str,
        model: str,
        upstream_model: str | None = None,
        system: str = "openai",
        server_address: str | None = None,
        server_port: int | None = None,
    ) -> UpstreamAttempt:
        """Start one upstream attempt (a fallback calls this again for the next candidate)."""
        if self.attempts and self.backend and self.backend != backend:
            self.metrics.observe_fallback(self.route or "", self.backend, backend)
        self.attempts += 1
        self.backend, self.model = backend, model
        span = self.trace.start_upstream(
            f"chat {upstream_model or model}",
            {a.GEN_AI_OPERATION_NAME: "chat", a.GEN_AI_SYSTEM: system,
             a.GEN_AI_PROVIDER_NAME: system, a.GEN_AI_REQUEST_MODEL: upstream_model or model,
             a.RG_BACKEND: backend, a.RG_ATTEMPT: self.attempts,
             a.RG_FALLBACK: self.attempts > 1, a.SERVER_ADDRESS: server_address,
             a.SERVER_PORT: server_port},
        )
        self.metrics.in_flight.labels(self.metrics.label("backend", backend)).inc()
        self.timings.upstream_started()
        return UpstreamAttempt(self, span, backend, model)

    # facts -----------------------------------------------------------------
    def usage(self, *, input_tokens: Any = None, output_tokens: Any = None) -> None:
        if isinstance(input_tokens, int):
            self.input_tokens = input_tokens
        if isinstance(output_tokens, int):
            self.output_tokens = output_tokens

    def cost(self, usd: float) -> None:
        self.cost_usd = usd

    def content(self, *, prompt: str | None = None, completion: str | None = None) -> None:
        """Prompt/completion text on the root span — only when the policy records content."""
        if self.record_content:
            self.trace.set({a.GEN_AI_PROMPT: prompt, a.GEN_AI_COMPLETION: completion})

    # output ----------------------------------------------------------------
    def split(self) -> TimingSplit:
        return self.result if self.result is not None else self.timings.split()

    def server_timing(self) -> str:
        return self.split().server_timing()

    def finish(self, status: int, *, error_code: str | None = None) -> TimingSplit:
        """Close the request: root span, metrics, dashboard sample, access log (once)."""
        if self.result is not None:
            return self.result
        self.timings.finish()
        split = self.result = self.timings.split()
        backend, model = self.backend or "", self.model or ""
        actual_ttft = split.ttft_ms
        self.trace.set({
            a.GEN_AI_RESPONSE_MODEL: self.response_model, a.GEN_AI_RESPONSE_ID: self.response_id,
            a.GEN_AI_USAGE_INPUT_TOKENS: self.input_tokens,
            a.GEN_AI_USAGE_OUTPUT_TOKENS: self.output_tokens,
            a.GEN_AI_RESPONSE_FINISH_REASONS: self.finish_reasons or None,
            a.RG_ACTUAL_TTFT_MS: actual_ttft, a.RG_QUEUE_WAIT_MS: split.queue_ms,
            a.RG_GW_MS: split.gw_ms, a.RG_UPSTREAM_MS: split.upstream_ms,
            a.RG_INFERENCE_MS: split.inference_ms, a.RG_TOTAL_MS: split.total_ms,
            a.RG_COST_USD: self.cost_usd,
        })
        self.trace.end(status, error_code)
        self.metrics.observe_request(
            route=self.route or "", backend=backend, model=model, tenant=self.tenant or "",
            status=status, split=split, input_tokens=self.input_tokens,
            output_tokens=self.output_tokens, cost_usd=self.cost_usd,
        )
        live = self._telemetry.live
        live.record(Sample(
            at_s=live.clock(), backend=backend, route=self.route or "", status=status,
            total_ms=split.total_ms, queue_ms=split.queue_ms, ttft_ms=split.ttft_ms,
            inference_ms=split.inference_ms, reason=self.reason, cost_usd=self.cost_usd or 0.0,
        ))
        self._telemetry.access_log.write(AccessRecord(
            request_id=self.request_id, method=self.method, path=self.path, status=status,
            trace_id=self.trace_id, tenant=self.tenant, route=self.route,
            backend=self.backend, model=self.model, stream=self.stream, attempts=self.attempts,
            decision_reason=self.reason, error_code=error_code, input_tokens=self.input_tokens,
            output_tokens=self.output_tokens, cost_usd=self.cost_usd,
            timing=AccessRecord.timing_of(split),
        ))
        return split


class Telemetry:
    """App-wide telemetry objects; `begin()` one `RequestTelemetry` per request."""

    def __init__(
        self,
        *,
        provider: TracerProvider | None = None,
        metrics: GatewayMetrics | None = None,
        access_log: AccessLog | None = None,
        live: LiveStats | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.provider: TracerProvider = provider or NoOpTracerProvider()
        self.metrics = metrics or GatewayMetrics()
        self.access_log = access_log or AccessLog()
        self.live = live or LiveStats()
        self.clock: Clock = clock or perf_counter

    def begin(
        self, *, request_id: str, method: str, path: str, headers: Mapping[str, str],
        record_content: bool = False,
    ) -> RequestTelemetry:
        return RequestTelemetry(
            self, request_id=request_id, method=method, path=path, headers=headers,
            record_content=record_content,
        )

    def shutdown(self) -> None:
        """Flush spans still batched (the SDK provider; the no-op one has nothing)."""
        shutdown = getattr(self.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()

