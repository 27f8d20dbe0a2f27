"""The direct OTLP encoder writes exactly what the OpenTelemetry exporter's encoder writes."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode

from gateway.telemetry.light_span import LightSpan, _Direct
from gateway.telemetry.otlp_encode import OtlpEncoder
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import (
    FastOtlpHttpExporter,
    resource_from_env,
    tracer_provider_from_env,
)
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import scripted_request

INBOUND = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def recording(resource: Resource) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def decoded(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(OtlpEncoder().request(spans))


async def test_a_gateway_request_encodes_as_the_sdk_encodes_it() -> None:
    provider, exporter = recording(resource_from_env({}, "routegate"))
    telemetry = Telemetry(provider=provider)
    await scripted_request(telemetry, FakeClock())  # events, decision lists, timings
    await scripted_request(telemetry, FakeClock(), headers={"traceparent": INBOUND},
                           status=503)  # remote parent, error status
    spans = list(exporter.get_finished_spans())
    assert decoded(spans) == encode_spans(spans)


def test_every_value_type_links_and_several_resources_and_scopes() -> None:
    provider, exporter = recording(Resource({"service.name": "a", "n": 3}))
    other, other_exporter = recording(Resource({"service.name": "b"}))
    tracer = provider.get_tracer("one", "1.0")
    linked = tracer.start_span("linked")
    linked.end()
    span = tracer.start_span("values", links=[Link(linked.get_span_context(), {"k": "v"})],
                             attributes={"s": "x", "b": False, "i": -5, "big": 2**40,
                                         "f": 1.5, "ls": ["a", "b"], "li": [1, 2],
                                         "lf": [0.5], "lb": [True], "long": "y" * 500})
    span.add_event("e", {"at": 1})
    span.set_status(Status(StatusCode.ERROR, "broken"))
    span.end()
    provider.get_tracer("two").start_span("second scope").end()
    other.get_tracer("one").start_span("second resource").end()
    spans = [*exporter.get_finished_spans(), *other_exporter.get_finished_spans()]
    assert decoded(spans) == encode_spans(spans)


def test_repeated_attribute_pairs_are_encoded_from_the_cache_identically() -> None:
    provider, exporter = recording(resource_from_env({}, "routegate"))
    tracer = provider.get_tracer("t")
    for value in ("POST", "POST", "GET"):
        tracer.start_span("s", attributes={"http.request.method": value}).end()
    encoder = OtlpEncoder()
    spans = list(exporter.get_finished_spans())
    first = encoder.request(spans)
    assert encoder.request(spans) == first
    assert ExportTraceServiceRequest.FromString(first) == encode_spans(spans)


def test_the_http_exporter_from_the_environment_uses_it() -> None:
    exporter = FastOtlpHttpExporter(endpoint="http://127.0.0.1:1/v1/traces")
    assert isinstance(exporter._encoder, OtlpEncoder)
    exporter.shutdown()


class Captured(FastOtlpHttpExporter):
    """The real exporter, keeping each batch instead of sending it."""

    def __init__(self) -> None:
        super().__init__(endpoint="http://127.0.0.1:9/v1/traces")
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += spans
        return SpanExportResult.SUCCESS


async def test_a_requests_spans_go_to_the_batch_together_and_encode_as_readable_spans() -> None:
    exporter = Captured()
    provider = tracer_provider_from_env({}, exporters=[exporter])
    assert provider is not None
    telemetry = Telemetry(provider=provider)
    await scripted_request(telemetry, FakeClock())
    await scripted_request(telemetry, FakeClock(), headers={"traceparent": INBOUND},
                           status=503)
    provider.force_flush()
    requests = exporter.spans
    assert [len(r) for r in requests] == [6, 6]  # type: ignore[arg-type]
    light = [s for r in requests for s in r]  # type: ignore[attr-defined]
    assert all(isinstance(s, LightSpan) for s in light)
    assert requests[0][-1].parent is None  # type: ignore[index]  # the root comes last
    readable = [ReadableSpan(s.name, s.context, s.parent, s.resource, s.attributes,
                             tuple(s.events), (), s.kind, None, s.status, s.start_time,
                             s.end_time, s.instrumentation_scope) for s in light]
    assert decoded(light) == encode_spans(readable)


def test_a_console_exporter_or_a_second_processor_gets_readable_spans() -> None:
    choices: list[list[SpanExporter]] = [[ConsoleSpanExporter()],
                                         [Captured(), InMemorySpanExporter()]]
    for exporters in choices:
        provider = tracer_provider_from_env({}, exporters=exporters)
        assert provider is not None
        children = Telemetry(provider=provider).children
        assert children is not None and not isinstance(children._on_end, _Direct)


async def test_a_child_ending_after_its_root_is_still_exported() -> None:
    exporter = Captured()
    provider = tracer_provider_from_env({}, exporters=[exporter])
    assert provider is not None
    tel = Telemetry(provider=provider).begin(request_id="r", method="POST",
                                             path="/v1/chat/completions", headers={})
    late = tel.trace.start("routegate.late")
    tel.trace.end(200)
    late.end()
    provider.force_flush()
    assert all(isinstance(s, LightSpan) for s in exporter.spans)  # each on its own
    (scope,) = decoded(exporter.spans).resource_spans[0].scope_spans
    assert [s.name for s in scope.spans] == ["POST /v1/chat/completions", "routegate.late"]


def test_the_batch_limits_count_spans_while_its_items_are_requests() -> None:
    provider = tracer_provider_from_env({}, exporters=[Captured()])
    assert provider is not None
    Telemetry(provider=provider)
    Telemetry(provider=provider)  # a second app on the same provider: divided once
    (batch,) = provider._active_span_processor._span_processors
    queue = batch._batch_processor  # type: ignore[attr-defined]
    assert queue._max_export_batch_size == 2048 // 6
    assert queue._queue.maxlen == queue._max_queue_size == 8192 // 6


def test_spans_of_interleaved_traces_and_parents_and_each_status_encode_as_the_sdk() -> None:
    provider, exporter = recording(resource_from_env({}, "routegate"))
    tracer = provider.get_tracer("t")
    roots = [tracer.start_span("a"), tracer.start_span("b")]
    for n, code in enumerate((StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR) * 2):
        parent = roots[n % 2]
        child = tracer.start_span("c", context=trace.set_span_in_context(parent))
        child.set_status(Status(code))
        child.end()
    for root in roots:
        root.end()
    spans = list(exporter.get_finished_spans())
    assert decoded(spans) == encode_spans(spans)
    one = OtlpEncoder().span(spans[0])
    assert Span.FromString(one) == encode_spans(spans[:1]).resource_spans[0].scope_spans[0].spans[0]
