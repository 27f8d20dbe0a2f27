"""The request's root span on the cheap path: what `Tracer.start_span` would have made."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanKind,
)

from gateway.telemetry.light_span import ChildSpans, LightSpan
from gateway.telemetry.spans import extract_parent, tracer_of
from tests.gateway.telemetry.sampling import INBOUND, UNSAMPLED, Tagging


def both(sampler: Sampler, headers: dict[str, str]) -> tuple[Any, Any, list[ReadableSpan]]:
    """The same root made by the SDK and by `ChildSpans.root`, each ended."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_of(provider)
    children = ChildSpans.for_tracer(tracer)
    assert children is not None
    attributes = {"http.route": "/v1/chat/completions", "routegate.request_id": "r1"}
    context = extract_parent(headers)
    sdk = tracer.start_span("POST /x", context=context, kind=SpanKind.SERVER,
                            attributes=dict(attributes))
    light = children.root("POST /x", context, SpanKind.SERVER, dict(attributes))
    sdk.end()
    light.end()
    return sdk, light, list(exporter.get_finished_spans())


def same_except_ids(sdk: ReadableSpan, light: ReadableSpan, *, same_trace: bool) -> None:
    assert light.name == sdk.name and light.kind is sdk.kind is SpanKind.SERVER
    assert dict(light.attributes or {}) == dict(sdk.attributes or {})
    assert light.context.trace_flags == sdk.context.trace_flags
    assert light.context.trace_state == sdk.context.trace_state
    assert light.context.is_remote is sdk.context.is_remote is False
    assert light.parent == sdk.parent
    assert light.resource is sdk.resource
    assert light.instrumentation_scope == sdk.instrumentation_scope
    assert light.status.status_code == sdk.status.status_code
    assert (light.context.trace_id == sdk.context.trace_id) is same_trace


def test_a_new_trace_is_recorded_as_the_sdk_records_it() -> None:
    _, light, (sdk_done, light_done) = both(ParentBased(ALWAYS_ON), {})
    assert isinstance(light, LightSpan)
    assert light_done.parent is None
    same_except_ids(sdk_done, light_done, same_trace=False)


def test_an_inbound_traceparent_is_continued_with_its_tracestate() -> None:
    _, light, (sdk_done, light_done) = both(ParentBased(ALWAYS_ON), INBOUND)
    assert light.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert light_done.parent is not None and light_done.parent.span_id == 0xB7AD6B7169203331
    assert light_done.parent.is_remote
    same_except_ids(sdk_done, light_done, same_trace=True)


def test_the_samplers_attributes_and_trace_state_reach_the_span() -> None:
    _, _, (sdk_done, light_done) = both(Tagging(), INBOUND)
    assert light_done.attributes is not None and light_done.attributes["sampled.by"] == "t"
    assert light_done.context.trace_state.get("rg") == "1"
    same_except_ids(sdk_done, light_done, same_trace=True)


def test_an_unsampled_root_is_not_recording_and_not_exported() -> None:
    for sampler, headers in ((ALWAYS_OFF, {}), (ParentBased(ALWAYS_ON), UNSAMPLED)):
        sdk, light, finished = both(sampler, headers)
        assert finished == []
        assert isinstance(light, NonRecordingSpan) and not light.is_recording()
        assert light.get_span_context().trace_flags == sdk.get_span_context().trace_flags
        assert light.get_span_context().is_valid
