"""The telemetry seam of the request pipeline: one `RequestTelemetry` per request.

The pipeline tells it what happened, step by step; it keeps the span tree, the
clock marks (`RequestTimings`, the same object behind the `Server-Timing`
header) and the facts of the request, and `finish()` turns them into the root
span's attributes, the metrics, the live dashboard's sample and the access log
line — once, whatever path the request took (success, error, disconnect).

    tel = telemetry.begin(request_id=..., method="POST", path=..., headers=request.headers)
    with tel.step("routegate.auth"): ...
    tel.identify(tenant=..., requested_model=..., stream=...)
    with tel.step("routegate.route") as span: ...; tel.decided(span, model, candidates, decision)
    async with tel.queued(backend, slot_context_manager): ...
    attempt = tel.upstream(target, upstream_headers)   # starts the clock, injects traceparent
    attempt.responded(resp.headers); attempt.relayed(bytes_out) ...; attempt.end()
    tel.finish(status)
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

import gateway.telemetry.semconv as a
from gateway.telemetry.access_log import AccessRecord
from gateway.telemetry.attempt import UpstreamAttempt
from gateway.telemetry.content import StreamText, completion_text, prompt_text
from gateway.telemetry.live import Sample
from gateway.telemetry.queue_wait import Queued, QueueWait
from gateway.telemetry.record_span import RecordedTrace, give_facts
from gateway.telemetry.span_facts import DECISION, ROOT, UPSTREAM, Facts
from gateway.telemetry.spans import RequestTrace
from gateway.telemetry.timing import RequestTimings, TimingSplit

if TYPE_CHECKING:
    from gateway.telemetry.service import Telemetry

# The gateway's endpoint names → GenAI `gen_ai.operation.name` values.
OPERATIONS = {"chat.completions": "chat", "completions": "text_completion",
              "embeddings": "embeddings", "messages": "chat", "responses": "chat"}


class RequestTelemetry:
    # Facts only a traced request keeps (`identify`, `routed`, `content`): class-level
    # defaults, so a request that is not traced never stores them.
    _stream_fact: bool | None = None
    _operation: str | None = None
    _max_tokens: int | None = None
    _temperature: float | None = None
    _decided: tuple[str | None, str | None, float | None] = (None, None, None)
    _content: tuple[str | None, str | None] = (None, None)  # prompt, completion
    _stream_text: StreamText | None = None  # a stream's completion, as it is relayed
    cache: str | None = None  # the response cache's answer: hit | miss | bypass

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        request_id: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        record_content: bool = False,
        timings: RequestTimings | None = None,
        client: str | None = None,
    ) -> None:
        self.metrics = telemetry.metrics
        self._telemetry = telemetry
        self.timings = timings if timings is not None else RequestTimings(clock=telemetry.clock)
        records = telemetry.records
        self.trace: RequestTrace | RecordedTrace
        if records is not None:
            self.trace = records.trace(f"{method} {path}", headers, {
                a.HTTP_REQUEST_METHOD: method, a.HTTP_ROUTE: path, a.RG_REQUEST_ID: request_id})
        elif telemetry.traced:
            self.trace = RequestTrace(
                telemetry.tracer,
                name=f"{method} {path}",
                headers=headers,
                attributes={a.HTTP_REQUEST_METHOD: method, a.HTTP_ROUTE: path,
                            a.RG_REQUEST_ID: request_id},
                children=telemetry.children,
            )
        else:
            self.trace = RequestTrace.untraced(headers)
        self.request_id, self.method, self.path = request_id, method, path
        self.client = client  # the peer address (access log)
        self.auth: str | None = None  # key | anonymous | unknown_key (access log)
        # prompt and completion text: only on a recorded root, only when the policy says
        self.record_content = record_content and self.trace.recording
        self.tenant: str | None = None
        self.priority = "normal"  # the tenant's queue band: a label of queue waits and sheds
        self.route: str | None = None
        self.backend: str | None = None
        self.model: str | None = None
        self.requested_model: str | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.reason: str | None = None
        self.stream = False
        self.attempts = 0
        self.attempt: UpstreamAttempt | None = None  # the latest
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
    ) -> AbstractContextManager[Span]:
        """A child span around one step (`routegate.auth`, `.rate_limit`, `.route`, …)."""
        return self.trace.step(name, attributes)

    def identify(
        self,
        *,
        tenant: str | None = None,
        priority: str | None = None,
        requested_model: str | None = None,
        stream: bool | None = None,
        operation: str = "chat",
        max_tokens: Any = None,
        temperature: Any = None,
        auth: str | None = None,
    ) -> None:
        if tenant is not None:
            self.tenant = tenant
        if auth is not None:
            self.auth = auth
        if priority is not None:
            self.priority = priority
        if requested_model is not None:
            self.requested_model = requested_model
        if stream is not None:
            self.stream = stream
        if not self.trace.recording:
            return
        # facts of the root span (`_facts`); a value not given keeps the one before
        if stream is not None:
            self._stream_fact = stream
        self._operation = OPERATIONS.get(operation, operation)
        if isinstance(max_tokens, int):
            self._max_tokens = max_tokens
        if isinstance(temperature, (int, float)):
            self._temperature = temperature

    def rejected(self, kind: str, *, limit: str | None = None, priority: str | None = None) -> None:
        """Refused before an upstream call: kind = rate_limit | budget | shed."""
        if kind == "shed":
            self.metrics.observe_shed(self.backend or "", priority or self.priority)
        else:
            self.metrics.observe_rejection(self.tenant or "", limit or kind)
        self._telemetry.live.rejected(kind)

    def refused(self, status: int, code: str | None, kind: str | None = None) -> None:
        """An error before any upstream attempt: count it if it was a limit or a shed."""
        if self.attempts:
            return
        code = code or ""
        if code == "budget_exceeded":
            self.rejected("budget", limit="budget")
        elif status == 429:
            self.rejected("rate_limit", limit={"requests": "rpm", "tokens": "tpm"}.get(
                kind or "", kind or "rate"))
        elif status == 503 and any(word in code for word in ("shed", "overload", "queue")):
            self.rejected("shed")

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
        self.metrics.observe_decision(route, backend, reason)
        if not self.trace.recording:
            return
        if span is not None and span.is_recording():
            facts = (DECISION, route, backend, reason, decision_id, predicted_ttft_ms,
                     predicted_total_ms, predicted_cost_usd, candidates, excluded)
            give_facts(span, facts)
        # The root repeats only the headline; `backend` is the decision's (a fallback
        # changes `self.backend`).
        self._decided = (backend, decision_id, predicted_ttft_ms)

    def decided(self, span: Span | None, model: str, candidates: Sequence[Any],
                decision: Any = None) -> None:
        """`routed()` from the pipeline's values: ordered `ModelTarget`s and, when the
        router made one, its `RouteDecision` (read by attribute: routing stays unaware)."""
        if not candidates:
            return
        first = candidates[0]
        primary = getattr(decision, "primary", None)
        excluded = getattr(decision, "excluded", ()) or ()
        if decision is None:
            reason = "static"  # the route's targets in the order written
        elif getattr(decision, "budget_missed", False):
            reason = "budget_miss"
        else:
            reason = str(getattr(decision, "objective", "static"))
        cost_micro = getattr(primary, "cost_micro_usd", None)
        self.routed(
            span,
            route=str(getattr(decision, "route", None) or model),
            backend=first.backend_name,
            model=first.model_name,
            reason=reason,
            decision_id=getattr(decision, "decision_id", None),
            predicted_ttft_ms=getattr(primary, "ttft_ms", None),
            predicted_total_ms=getattr(primary, "total_ms", None),
            predicted_cost_usd=cost_micro / 1e6 if isinstance(cost_micro, int) else None,
            candidates=[c.key for c in candidates] if self.trace.recording else None,
            excluded=([f"{e.key}: {e.reason}" for e in excluded] or None)
            if self.trace.recording else None,
        )

    def queue_wait(self, backend: str) -> QueueWait:
        """Around waiting for a backend slot: span, queue-depth gauge, and — unless the
        queue reported its own wait through `timings.add_wait("queue", …)` — the clock."""
        return QueueWait(self, backend)

    def queued(self, backend: str, slot: AbstractAsyncContextManager[Any]) -> Queued:
        """Hold `slot` (a queue's context manager) with the wait for it traced."""
        return Queued(self, backend, slot)

    def upstream(self, target: Any, headers: MutableMapping[str, str] | None = None,
                 ) -> UpstreamAttempt:
        """Start one attempt on a `ModelTarget` (a fallback calls this again): CLIENT span,
        upstream clock, and `traceparent` injected into `headers`."""
        backend, model = target.backend_name, target.model_name
        if self.attempt is not None:
            self.attempt.end()
            # the same target again is a retry (counted as one); another model of the
            # same backend is a fallback too (from == to)
            if (self.backend, self.model) != (backend, model):
                self.metrics.observe_fallback(self.route or "", self.attempt.backend, backend)
        self.attempts += 1
        self.backend, self.model = backend, model
        system = getattr(target.backend, "type", "openai")
        upstream_name = getattr(target, "upstream_name", None) or model
        span = self.trace.start_upstream(f"chat {upstream_name}", facts=(
            UPSTREAM, "chat", system, system, upstream_name, backend, self.attempts,
            self.attempts > 1))
        self.metrics.in_flight_of(backend).inc()
        self.timings.upstream_started()
        self.attempt = UpstreamAttempt(self, span, backend, model)
        if headers is not None:
            self.attempt.inject(headers)
        return self.attempt

    # what the relay sees, for the current attempt ---------------------------
    def requested(self, body: Mapping[str, Any]) -> None:
        """The parsed request body: its prompt, when the policy records content."""
        if self.record_content:
            self._content = (prompt_text(body), self._content[1])

    def relayed(self, data: bytes) -> None:
        """SSE bytes about to be written to the client."""
        if self.attempt is not None and data:
            self.attempt.relayed(data)
            if self.record_content:
                if self._stream_text is None:
                    self._stream_text = StreamText()
                self._stream_text.feed(data)

    def response_json(self, body: Mapping[str, Any]) -> None:
        """A successful non-streamed JSON response, parsed once by the relay."""
        if self.attempt is not None:
            self.attempt.body(body)
            if self.record_content:
                self._content = (self._content[0], completion_text(body))

    def final_chunk(self, chunk: Mapping[str, Any] | None) -> None:
        """A stream's last JSON chunk (usage, and a backend's timings when it sends them)."""
        if self.attempt is not None and chunk:
            self.attempt.body(chunk)

    # facts -----------------------------------------------------------------
    def usage(self, *, input_tokens: Any = None, output_tokens: Any = None) -> None:
        if isinstance(input_tokens, int):
            self.input_tokens = input_tokens
        if isinstance(output_tokens, int):
            self.output_tokens = output_tokens

    def cost(self, usd: float) -> None:
        self.cost_usd = usd

    def price(self, target: Any) -> None:
        """Cost at the policy's per-token prices (a dedicated backend's is its GPU-hours)."""
        spec = getattr(target, "spec", None)
        if spec is None or (self.input_tokens is None and self.output_tokens is None):
            return
        self.cost_usd = round(
            (self.input_tokens or 0) * spec.input_usd_per_mtok / 1e6
            + (self.output_tokens or 0) * spec.output_usd_per_mtok / 1e6, 9)

    def content(self, *, prompt: str | None = None, completion: str | None = None) -> None:
        """Prompt/completion text on the root span — only when the policy records content."""
        if self.record_content:
            self._content = (prompt, completion)

    # output ----------------------------------------------------------------
    def split(self) -> TimingSplit:
        return self.result if self.result is not None else self.timings.split()

    def server_timing(self) -> str:
        return self.split().server_timing()

    def close(self, status: int | None, *, usage: Mapping[str, Any] | None = None,
              target: Any = None, error_code: str | None = None) -> TimingSplit:
        """`finish()` from the pipeline's values: final usage, priced at `target`."""
        if usage:
            self.usage(input_tokens=usage.get("prompt_tokens", usage.get("input_tokens")),
                       output_tokens=usage.get("completion_tokens",
                                               usage.get("output_tokens")))
        if target is not None and self.cost_usd is None:
            self.price(target)
        # No status means an unexpected exception: the middleware answers 500.
        return self.finish(status if status is not None else 500, error_code=error_code)

    def _facts(self, split: TimingSplit) -> Facts:
        """The root span's facts (`span_facts.KEYS[ROOT]`)."""
        backend, decision_id, predicted_ttft_ms = self._decided
        prompt, completion = self._content
        if completion is None and self._stream_text is not None:
            completion = self._stream_text.text()
        return (
            ROOT, self.tenant, self.requested_model, self._stream_fact, self._operation,
            self._max_tokens, self._temperature,
            self.route, backend, self.reason, decision_id, predicted_ttft_ms,
            prompt, completion,
            self.response_model, self.response_id, self.input_tokens, self.output_tokens,
            list(self.finish_reasons) or None,
            split.ttft_ms, split.queue_ms, split.gw_ms, split.upstream_ms,
            split.inference_ms, split.total_ms, self.cost_usd, self.cache,
        )

    def finish(self, status: int, *, error_code: str | None = None) -> TimingSplit:
        """Close the request: root span, metrics, dashboard sample, access log (once)."""
        if self.result is not None:
            return self.result
        # dropped here: the attempt refers back to this request, and a cycle would leave
        # the request's objects to the garbage collector instead of refcounting
        attempt, self.attempt = self.attempt, None
        if attempt is not None:
            attempt.end()  # a disconnect may leave it open
        self.timings.finish()
        split = self.result = self.timings.split()
        backend, model = self.backend or "", self.model or ""
        if self.trace.recording:
            self.trace.close(self._facts(split), status, error_code)
        else:
            self.trace.end(status, error_code)
        self.metrics.observe_request(
            route=self.route or "", backend=backend, model=model, tenant=self.tenant or "",
            priority=self.priority, status=status, split=split, input_tokens=self.input_tokens,
            output_tokens=self.output_tokens, cost_usd=self.cost_usd,
        )
        live = self._telemetry.live
        live.record(Sample(
            at_s=live.clock(), backend=backend, route=self.route or "", status=status,
            total_ms=split.total_ms, queue_ms=split.queue_ms, ttft_ms=split.ttft_ms,
            inference_ms=split.inference_ms, reason=self.reason, cost_usd=self.cost_usd or 0.0,
            cache=self.cache,
        ))
        access_log = self._telemetry.access_log
        if not access_log.enabled:
            return split
        access_log.write(AccessRecord(
            request_id=self.request_id, method=self.method, path=self.path, status=status,
            client=self.client, trace_id=self.trace_id, tenant=self.tenant, auth=self.auth,
            route=self.route,
            backend=self.backend, model=self.model, stream=self.stream, attempts=self.attempts,
            decision_reason=self.reason, error_code=error_code, input_tokens=self.input_tokens,
            output_tokens=self.output_tokens, cost_usd=self.cost_usd,
            timing=AccessRecord.timing_of(split),
        ))
        return split
