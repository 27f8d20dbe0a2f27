"""What the root-sampling tests share: inbound trace contexts, a sampler that leaves
its mark, and a records sink that keeps what the request path hands it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span

from gateway.telemetry.span_records import Record, record_of

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


class Kept(SpanProcessor):
    """A records sink that keeps what it is given (the seam `SpanPipe` fills)."""

    takes_records = True

    def __init__(self) -> None:
        self.records: list[Record] = []

    def append(self, record: Record) -> None:
        self.records.append(record)

    def on_end(self, span: ReadableSpan) -> None:
        scope = span.instrumentation_scope
        assert scope is not None
        self.records.append(record_of(span, (scope.name, scope.version, scope.schema_url)))

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None
