"""Span attributes made from a request's facts, in one place for every export path.

`RequestTelemetry` keeps what it learns as plain values and hands a span its facts
as one tuple: a kind (`ROOT`, `DECISION`, `UPSTREAM`, `QUEUE`), then one value per key of
that kind, in order. On the in-process paths a span's attributes are made from it
at once (`attributes_from`); a request recorded for the exporter process carries
the tuples themselves, and the exporter process makes the same attributes from
them (`span_records.expanded`), so the request path builds no attribute dict for
them. Nothing here imports OpenTelemetry: the exporter process imports this.
"""

from __future__ import annotations

from typing import Any

import gateway.telemetry.semconv as a

ROOT, DECISION, UPSTREAM, QUEUE = 0, 1, 2, 3  # what a facts tuple's values are (its first item)

# The attribute each value of a kind's facts becomes (None: left out).
KEYS: tuple[tuple[str, ...], ...] = (
    (  # ROOT: the request (`RequestTelemetry._facts`)
        a.RG_TENANT, a.GEN_AI_REQUEST_MODEL, a.RG_STREAM, a.GEN_AI_OPERATION_NAME,
        a.GEN_AI_REQUEST_MAX_TOKENS, a.GEN_AI_REQUEST_TEMPERATURE,
        a.RG_ROUTE, a.RG_BACKEND, a.RG_DECISION_REASON, a.RG_DECISION_ID,
        a.RG_PREDICTED_TTFT_MS,
        a.GEN_AI_PROMPT, a.GEN_AI_COMPLETION,
        a.GEN_AI_RESPONSE_MODEL, a.GEN_AI_RESPONSE_ID, a.GEN_AI_USAGE_INPUT_TOKENS,
        a.GEN_AI_USAGE_OUTPUT_TOKENS, a.GEN_AI_RESPONSE_FINISH_REASONS,
        a.RG_ACTUAL_TTFT_MS, a.RG_QUEUE_WAIT_MS, a.RG_GW_MS, a.RG_UPSTREAM_MS,
        a.RG_INFERENCE_MS, a.RG_TOTAL_MS, a.RG_COST_USD, a.RG_CACHE,
    ),
    (  # DECISION: the route span (`RequestTelemetry.routed`)
        a.RG_ROUTE, a.RG_BACKEND, a.RG_DECISION_REASON, a.RG_DECISION_ID,
        a.RG_PREDICTED_TTFT_MS, a.RG_PREDICTED_TOTAL_MS, a.RG_PREDICTED_COST_USD,
        a.RG_CANDIDATES, a.RG_EXCLUDED,
    ),
    (  # UPSTREAM: an attempt's CLIENT span (`RequestTelemetry.upstream`)
        a.GEN_AI_OPERATION_NAME, a.GEN_AI_SYSTEM, a.GEN_AI_PROVIDER_NAME,
        a.GEN_AI_REQUEST_MODEL, a.RG_BACKEND, a.RG_ATTEMPT, a.RG_FALLBACK,
    ),
    (a.RG_BACKEND, a.RG_QUEUE_WAIT_MS),  # QUEUE: the wait for a backend slot (`QueueWait`)
)

Facts = tuple[Any, ...]  # (kind, value, value, …)


def attributes_from(facts: Facts) -> dict[str, Any]:
    """The attributes of `facts`; an unknown (None) figure is absent."""
    return {key: value for key, value in zip(KEYS[facts[0]], facts[1:], strict=True)
            if value is not None}


def note_status(attributes: dict[str, Any], status: int, error_type: str | None) -> bool:
    """Put the response status (and `error.type` for an error) into a root's
    `attributes`; True when the root's status is ERROR (a 5xx)."""
    attributes[a.HTTP_RESPONSE_STATUS_CODE] = status
    if status >= 500 or error_type:
        attributes[a.ERROR_TYPE] = error_type or str(status)
    return status >= 500
