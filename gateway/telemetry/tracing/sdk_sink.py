"""The one adapter from request records to the OpenTelemetry SDK: each record's spans
(`span_build.py`) as the SDK's `ReadableSpan`s, handed to stock span processors (a
`BatchSpanProcessor` with any exporter: gRPC, console, a test's in-memory one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from gateway.core.record import RequestRecord
from gateway.telemetry.tracing.span_build import SCOPE_NAME, SpanData, spans_of
from gateway.telemetry.tracing.trace_context import new_span_id

_KINDS = {kind.value: kind for kind in SpanKind}
_CODES = {code.value: code for code in StatusCode}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _frozen(attributes: dict[str, Any]) -> dict[str, Any]:
    """Lists become tuples, as the SDK stores attribute values."""
    return {key: tuple(value) if type(value) is list else value
            for key, value in attributes.items()}


def readable_spans(record: RequestRecord, resource: Resource, scope: InstrumentationScope,
                   new_id: Callable[[], int] = new_span_id) -> list[ReadableSpan]:
    """The SDK's form of a sampled, finished record's spans."""
    trace = record.trace
    assert trace is not None
    state = TraceState(list(trace.trace_state)) if trace.trace_state else None

    def context(span_id: int, remote: bool = False) -> SpanContext:
        return SpanContext(trace.trace_id, span_id, remote, _SAMPLED, state)

    def readable(span: SpanData) -> ReadableSpan:
        parent = context(span.parent_id, span.parent_remote) if span.parent_id else None
        return ReadableSpan(
            name=span.name, context=context(span.span_id), parent=parent, resource=resource,
            attributes=_frozen(span.attributes),
            events=[Event(name, attributes or {}, timestamp)
                    for name, timestamp, attributes in span.events],
            kind=_KINDS[span.kind], instrumentation_scope=scope,
            status=Status(_CODES[span.code], span.description),
            start_time=span.start_ns, end_time=span.end_ns)

    return [readable(span) for span in spans_of(record, new_id)]


class ProcessorSink:
    """Records into the SDK's span processors, in the gateway process."""

    def __init__(self, processors: Sequence[SpanProcessor], resource: Resource) -> None:
        self.processors = tuple(processors)
        self.resource = resource
        self.scope = InstrumentationScope(SCOPE_NAME)

    def export(self, record: RequestRecord) -> None:
        for span in readable_spans(record, self.resource, self.scope):
            for processor in self.processors:
                processor.on_end(span)

    @property
    def dropped_spans(self) -> int:
        return 0  # the SDK's batch processor logs its own drops

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)

    def shutdown(self) -> None:
        for processor in self.processors:
            processor.shutdown()
