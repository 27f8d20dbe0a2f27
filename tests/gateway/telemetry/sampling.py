"""What the sampling tests share: inbound trace contexts, a sampler that leaves its
mark, and a records sink that keeps what the request path hands it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span

from gateway.core.record import RequestRecord

INBOUND = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
           "tracestate": "vendor=abc"}
UNSAMPLED = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}


class Tagging(Sampler):
    """Samples, adds an attribute and a trace-state entry: both must reach the span."""

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Any = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        state = get_current_span(parent_context).get_span_context().trace_state or TraceState()
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {**(attributes or {}), "sampled.by": "t"},
                              state.add("rg", "1"))

    def get_description(self) -> str:
        return "Tagging"


class Kept:
    """A records sink that keeps what it is given (the seam `SpanPipe` fills)."""

    dropped_spans = 0

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def export(self, record: RequestRecord) -> None:
        self.records.append(record)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        return None
