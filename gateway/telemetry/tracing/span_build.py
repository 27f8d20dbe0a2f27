"""A finished request record → its spans. The one place a span's name, parent and
attributes are decided, for every export path:

    POST /v1/chat/completions           SERVER  (root; continues an inbound traceparent)
    ├── routegate.auth
    ├── routegate.rate_limit
    ├── routegate.route                 the decision (backend, reason, predictions)
    ├── routegate.queue.wait            one per attempt that queued for a slot
    └── chat <model>                    CLIENT  (one per attempt; event gen_ai.first_token)
            └── engine.queue / engine.prefill / engine.decode   (the backend's own spans)

It runs in the trace exporter process (`export_process.py`, from the record as it
arrived) or, for any other exporter, in the gateway through `sdk_sink.py`. Nothing
here imports OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import gateway.telemetry.semconv as a
from gateway.core.record import AttemptRecord, RequestRecord, StepRecord

SCOPE_NAME = "routegate.gateway"  # the instrumentation scope of every gateway span
INTERNAL, SERVER, CLIENT = 0, 1, 2  # SpanKind values
UNSET, ERROR = 0, 2  # StatusCode values


class SpanData(NamedTuple):
    """One span as plain values (what the OTLP encoder writes; ids as ints)."""

    span_id: int
    parent_id: int  # 0: none
    parent_remote: bool
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, int, dict[str, Any] | None], ...]
    code: int
    description: str | None


def _known(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """Attributes with a value: an unknown figure is absent, never a placeholder."""
    return {key: value for key, value in pairs if value is not None}


def spans_of(record: RequestRecord, new_span_id: Callable[[], int]) -> list[SpanData]:
    """The spans of a sampled, finished `record`: children first, then the root."""
    trace = record.trace
    assert trace is not None and trace.sampled
    root_id = trace.span_id
    children: list[tuple[int, SpanData]] = []
    for step in record.steps:
        children.append((step.start_ns, _step_span(record, step, root_id, new_span_id())))
    for attempt in record.attempts:
        children.append((attempt.start_ns, _attempt_span(record, attempt, root_id)))
    children.sort(key=lambda pair: pair[0])
    spans = [span for _, span in children]
    spans.append(_root_span(record))
    return spans


def _root_span(record: RequestRecord) -> SpanData:
    trace = record.trace
    assert trace is not None
    status = record.status
    error_type = record.error_code or (str(status) if status >= 500 else None)
    attributes = _known((
        (a.HTTP_REQUEST_METHOD, record.method), (a.HTTP_ROUTE, record.path),
        (a.RG_REQUEST_ID, record.request_id),
        *trace.root_attributes,
        (a.RG_TENANT, record.tenant), (a.RG_BATCH_ID, record.batch_id),
        (a.GEN_AI_REQUEST_MODEL, record.requested_model or None),  # "": not parsed
        (a.RG_STREAM, record.stream if record.requested_model else None),
        (a.GEN_AI_OPERATION_NAME, record.operation),
        (a.GEN_AI_REQUEST_MAX_TOKENS, record.max_tokens),
        (a.GEN_AI_REQUEST_TEMPERATURE, record.temperature),
        (a.RG_ROUTE, record.route), (a.RG_BACKEND, record.decided_backend),
        (a.RG_DECISION_REASON, record.reason), (a.RG_DECISION_ID, record.decision_id),
        (a.RG_PREDICTED_TTFT_MS, record.predicted_ttft_ms),
        (a.GEN_AI_PROMPT, record.prompt), (a.GEN_AI_COMPLETION, record.completion),
        (a.GEN_AI_RESPONSE_MODEL, record.response_model),
        (a.GEN_AI_RESPONSE_ID, record.response_id),
        (a.GEN_AI_USAGE_INPUT_TOKENS, record.input_tokens),
        (a.GEN_AI_USAGE_OUTPUT_TOKENS, record.output_tokens),
        (a.GEN_AI_RESPONSE_FINISH_REASONS, list(record.finish_reasons) or None),
        (a.RG_ACTUAL_TTFT_MS, record.ttft_ms), (a.RG_QUEUE_WAIT_MS, record.queue_ms),
        (a.RG_GW_MS, record.gw_ms), (a.RG_UPSTREAM_MS, record.upstream_ms),
        (a.RG_INFERENCE_MS, record.inference_ms), (a.RG_TOTAL_MS, record.total_ms),
        (a.RG_COST_USD, record.cost_usd), (a.RG_CACHE, record.cache),
        (a.HTTP_RESPONSE_STATUS_CODE, status), (a.ERROR_TYPE, error_type),
    ))
    return SpanData(trace.span_id, trace.parent_id, trace.parent_remote,
                    f"{record.method} {record.path}", SERVER, record.start_ns, record.end_ns,
                    attributes, (), ERROR if status >= 500 else UNSET, None)


def _step_span(record: RequestRecord, step: StepRecord, root_id: int,
               span_id: int) -> SpanData:
    if step.name == "routegate.route" and record.route is not None:
        attributes = _known((
            (a.RG_ROUTE, record.route), (a.RG_BACKEND, record.decided_backend),
            (a.RG_DECISION_REASON, record.reason), (a.RG_DECISION_ID, record.decision_id),
            (a.RG_PREDICTED_TTFT_MS, record.predicted_ttft_ms),
            (a.RG_PREDICTED_TOTAL_MS, record.predicted_total_ms),
            (a.RG_PREDICTED_COST_USD, record.predicted_cost_micros / 1e6
             if record.predicted_cost_micros is not None else None),
            (a.RG_CANDIDATES, list(record.candidates) or None),
            (a.RG_EXCLUDED, list(record.excluded) or None),
        ))
    elif step.backend is not None:  # a queue wait
        attributes = _known(((a.RG_BACKEND, step.backend),
                             (a.RG_QUEUE_WAIT_MS, step.waited_ms)))
    else:
        attributes = {}
    code = UNSET
    if step.error_type is not None:
        attributes[a.ERROR_TYPE] = step.error_type
        code = ERROR
    return SpanData(span_id, root_id, False, step.name, INTERNAL, step.start_ns,
                    step.end_ns or record.end_ns, attributes, (), code, step.error_text)


def _attempt_span(record: RequestRecord, attempt: AttemptRecord, root_id: int) -> SpanData:
    attributes = _known((
        (a.GEN_AI_OPERATION_NAME, "chat"), (a.GEN_AI_SYSTEM, attempt.system),
        (a.GEN_AI_PROVIDER_NAME, attempt.system),
        (a.GEN_AI_REQUEST_MODEL, attempt.upstream_model), (a.RG_BACKEND, attempt.backend),
        (a.RG_ATTEMPT, attempt.number), (a.RG_FALLBACK, attempt.number > 1),
        (a.RG_DEADLINE_MS, attempt.deadline_ms),
        (a.HTTP_RESPONSE_STATUS_CODE, attempt.status),
        (a.ERROR_TYPE, attempt.error_type),
    ))
    events: tuple[tuple[str, int, dict[str, Any] | None], ...] = ()
    if attempt.first_token_ns:
        events = ((a.EVENT_FIRST_TOKEN, attempt.first_token_ns, None),)
    return SpanData(attempt.span_id, root_id, False, f"chat {attempt.upstream_model}", CLIENT,
                    attempt.start_ns, attempt.end_ns or record.end_ns, attributes, events,
                    ERROR if attempt.error_type is not None else UNSET, None)
