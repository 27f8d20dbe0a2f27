"""The request's own facts, written into its record as the pipeline learns them: what
was asked for (after parsing) and what the router decided."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.core.content import prompt_text
from gateway.core.record import RequestRecord
from policies.load import ModelTarget
from routing.decide import RouteDecision

# The gateway's endpoint names → GenAI `gen_ai.operation.name` values.
OPERATIONS = {"chat.completions": "chat", "completions": "text_completion",
              "embeddings": "embeddings", "messages": "chat", "responses": "chat"}


def note_request(record: RequestRecord, endpoint: str, model: str, stream: bool,
                 body: Mapping[str, Any]) -> None:
    """What the parsed body asks for (the prompt only when the policy records content)."""
    record.requested_model, record.stream = model, stream
    if not record.sampled:
        return
    record.operation = OPERATIONS.get(endpoint, endpoint)
    max_tokens, temperature = body.get("max_tokens"), body.get("temperature")
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        record.max_tokens = max_tokens
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        record.temperature = temperature
    if record.keeps_content:
        record.prompt = prompt_text(body)


def note_decision(record: RequestRecord, model: str, candidates: Sequence[ModelTarget],
                  decision: RouteDecision | None) -> None:
    """The routing outcome: ordered `candidates` and, when the router made one, its
    decision (None: the route's targets in the order written)."""
    if not candidates:
        return
    first, sampled = candidates[0], record.sampled
    record.decided_backend = first.backend_name
    if decision is None:
        record.route, record.reason = model, "static"
    else:
        record.route = decision.route or model
        record.reason = "budget_miss" if decision.budget_missed else str(decision.objective)
        record.decision_id = decision.decision_id
        primary = decision.primary
        if primary is not None:
            record.predicted_ttft_ms = primary.ttft_ms
            record.predicted_total_ms = primary.total_ms
            record.predicted_cost_micros = primary.cost_micro_usd
        if sampled:
            record.excluded = tuple(f"{e.key}: {e.reason}" for e in decision.excluded)
    if sampled:
        record.candidates = tuple(c.key for c in candidates)
