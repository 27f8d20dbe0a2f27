"""A traced request recorded for the exporter process: same spans, same OTLP bytes."""

from __future__ import annotations

from itertools import count
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.otlp_encode import EncodedBatch, OtlpEncoder
from gateway.telemetry.record_span import RecordedSpan, RecordSpans
from gateway.telemetry.service import Telemetry
from gateway.telemetry.span_records import Resource, Scope, Span, SpansOf
from gateway.telemetry.tracing import resource_from_env
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.sampling import Kept
from tests.gateway.telemetry.scripted_request import scripted_request

INBOUND = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "tracestate": "vendor=abc"}


def recorded() -> tuple[Telemetry, Kept]:
    kept = Kept()
    provider = TracerProvider(resource=resource_from_env({}, "routegate"))
    provider.add_span_processor(kept)
    telemetry = Telemetry(provider=provider, clock=FakeClock())
    assert isinstance(telemetry.records, RecordSpans)
    return telemetry, kept


async def two_requests(telemetry: Telemetry) -> None:
    clock = telemetry.clock if isinstance(telemetry.clock, FakeClock) else FakeClock()
    await scripted_request(telemetry, clock)  # events, decision lists, timings
    await scripted_request(telemetry, clock, headers=INBOUND, status=503)


def readable(span: Span, resource: Any, scope: InstrumentationScope) -> ReadableSpan:
    """The SDK's own span with what a rebuilt `Span` holds."""
    def context(c: Any) -> SpanContext:
        return SpanContext(c.trace_id, c.span_id, c.is_remote, TraceFlags(1),
                           TraceState(list((c.trace_state or {}).items())))
    return ReadableSpan(
        span.name, context(span.context), context(span.parent) if span.parent else None,
        resource, span.attributes, tuple(Event(e.name, e.attributes, e.timestamp)
                                         for e in span.events),
        tuple(Link(context(k.context), k.attributes) for k in span.links),
        SpanKind(span.kind.value), None,
        Status(StatusCode(span.status.status_code.value), span.status.description),
        span.start_time, span.end_time, scope)


async def test_records_encode_as_the_sdk_encodes_the_same_spans() -> None:
    telemetry, kept = recorded()
    await two_requests(telemetry)
    records = kept.records
    resource = resource_from_env({}, "routegate")
    spans = SpansOf(Resource(dict(resource.attributes)), count(1).__next__)(records)
    scope = InstrumentationScope("routegate.gateway", "", "")
    expected = encode_spans([readable(s, resource, scope) for s in spans])
    encoder, batch, new_id = OtlpEncoder(), EncodedBatch(), count(1).__next__
    for record in records:
        encoder.add_record(batch, record, lambda key: scope, new_id)
    ours = encoder.request_of(batch, resource)
    assert ExportTraceServiceRequest.FromString(ours) == expected
    new_root, continued_root = spans[5], spans[11]  # each request's root comes last
    assert new_root.parent is None
    assert continued_root.parent is not None and continued_root.parent.is_remote


async def test_a_recorded_request_has_the_spans_the_sdk_path_records() -> None:
    telemetry, kept = recorded()
    await two_requests(telemetry)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource_from_env({}, "routegate"))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    await two_requests(Telemetry(provider=provider, clock=FakeClock()))
    spans = SpansOf(Resource({}), count(1).__next__)(kept.records)

    def shape(span: Any, roots: set[int]) -> tuple[Any, ...]:
        attributes = {k: list(v) if isinstance(v, (list, tuple)) else v
                      for k, v in (span.attributes or {}).items()}
        parent = span.parent
        return (span.name, span.kind.value, attributes, [e.name for e in span.events],
                span.status.status_code.value, span.status.description,
                None if parent is None else "root" if parent.span_id in roots
                else f"{parent.span_id:x}/{parent.is_remote}")
    ours = [shape(s, {x.context.span_id for x in spans}) for s in spans]
    sdk = list(memory.get_finished_spans())
    theirs = [shape(s, {x.context.span_id for x in sdk}) for s in sdk]
    assert sorted(ours, key=repr) == sorted(theirs, key=repr)


async def test_only_the_upstream_span_gets_an_id_on_the_request_path() -> None:
    telemetry, kept = recorded()
    injected: dict[str, str] = {}
    await scripted_request(telemetry, FakeClock(), injected=injected)
    ((_, trace_id, _, root, children),) = kept.records
    with_ids = [child for child in children if child[0]]
    assert [child[1] for child in with_ids] == ["chat llama"]
    assert injected["traceparent"] == f"00-{trace_id:032x}-{with_ids[0][0]:016x}-01"
    assert root[0] and root[1] == 0  # the root's own id, no parent


def test_a_child_ending_after_its_root_is_a_record_of_its_own() -> None:
    telemetry, kept = recorded()
    tel = telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                          headers={})
    late = tel.trace.start("routegate.late")
    assert isinstance(late, RecordedSpan)
    tel.trace.end(200)
    late.set_status(StatusCode.ERROR, "too late")
    late.end()
    first, second = kept.records
    assert second[1] == first[1] and second[4] == ()
    assert second[3][1] == first[3][0]  # its parent: the root
    spans = SpansOf(Resource({}), count(1).__next__)(kept.records)
    assert spans[-1].status.description == "too late"


def test_another_tracers_spans_on_the_same_provider_are_recorded_too() -> None:
    telemetry, kept = recorded()
    tracer = telemetry.provider.get_tracer("other")
    linked = tracer.start_span("linked")
    linked.end()
    span = tracer.start_span("plain", links=[Link(linked.get_span_context(), {"k": "v"})],
                             attributes={"n": 1})
    span.end()
    spans = SpansOf(Resource({}), count(1).__next__)(kept.records)
    assert [s.name for s in spans] == ["linked", "plain"]
    assert isinstance(spans[1].instrumentation_scope, Scope)
    assert spans[1].links[0].context.span_id == linked.get_span_context().span_id


async def test_the_injected_traceparent_and_tracestate_are_the_w3c_propagators() -> None:
    telemetry, kept = recorded()
    injected: dict[str, str] = {}
    await scripted_request(telemetry, FakeClock(), headers=INBOUND, injected=injected)
    ((_, trace_id, state, _, children),) = kept.records
    (client_id,) = [child[0] for child in children if child[0]]
    client = SpanContext(trace_id, client_id, False, TraceFlags(TraceFlags.SAMPLED),
                         TraceState(list(state.items())))
    expected: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(
        expected, context=set_span_in_context(NonRecordingSpan(client)))
    assert injected == expected and expected["tracestate"] == "vendor=abc"
