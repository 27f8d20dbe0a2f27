"""A request's root span attributes, made from the request's facts in one place.

`RequestTelemetry` keeps what it learns as plain fields (tenant, the routing
decision, usage, the timing split, …) and at the end hands them over as one tuple,
in the order of `ROOT_FACTS`. On the in-process paths the root span's attributes
are made from it at once; a request recorded for the exporter process carries the
tuple itself, and the exporter process makes the same attributes from it
(`span_records.expanded`), so the request path builds no attribute dict for its
root. Nothing here imports OpenTelemetry: the exporter process imports this.
"""

from __future__ import annotations

from typing import Any

from gateway.telemetry import semconv as a

# The root attribute each position of a request's facts becomes (None: left out).
ROOT_FACTS = (
    a.RG_TENANT, a.GEN_AI_REQUEST_MODEL, a.RG_STREAM, a.GEN_AI_OPERATION_NAME,
    a.GEN_AI_REQUEST_MAX_TOKENS, a.GEN_AI_REQUEST_TEMPERATURE,
    a.RG_ROUTE, a.RG_BACKEND, a.RG_DECISION_REASON, a.RG_DECISION_ID,
    a.RG_PREDICTED_TTFT_MS,
    a.GEN_AI_PROMPT, a.GEN_AI_COMPLETION,
    a.GEN_AI_RESPONSE_MODEL, a.GEN_AI_RESPONSE_ID, a.GEN_AI_USAGE_INPUT_TOKENS,
    a.GEN_AI_USAGE_OUTPUT_TOKENS, a.GEN_AI_RESPONSE_FINISH_REASONS,
    a.RG_ACTUAL_TTFT_MS, a.RG_QUEUE_WAIT_MS, a.RG_GW_MS, a.RG_UPSTREAM_MS,
    a.RG_INFERENCE_MS, a.RG_TOTAL_MS, a.RG_COST_USD,
)

Facts = tuple[Any, ...]  # one value per `ROOT_FACTS` key


def root_attributes(facts: Facts) -> dict[str, Any]:
    """The root's attributes from its facts; an unknown (None) figure is absent."""
    return {key: value for key, value in zip(ROOT_FACTS, facts, strict=True)
            if value is not None}


def note_status(attributes: dict[str, Any], status: int, error_type: str | None) -> bool:
    """Put the response status (and `error.type` for an error) into a root's
    `attributes`; True when the root's status is ERROR (a 5xx)."""
    attributes[a.HTTP_RESPONSE_STATUS_CODE] = status
    if status >= 500 or error_type:
        attributes[a.ERROR_TYPE] = error_type or str(status)
    return status >= 500
