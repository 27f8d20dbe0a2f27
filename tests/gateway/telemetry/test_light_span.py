"""Child spans on the cheap path: the same finished spans the SDK would have produced."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from gateway.telemetry.light_span import ChildSpans, LightSpan
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import scripted_request


def traced() -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry(provider=provider), exporter


async def test_children_take_the_cheap_path_under_the_sdk_and_not_under_the_no_op_api() -> None:
    assert Telemetry(provider=NoOpTracerProvider()).children is None
    telemetry, _ = traced()
    assert telemetry.children is not None
    tel = telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                          headers={})
    with tel.step("routegate.auth") as span:
        assert isinstance(span, LightSpan)


async def test_children_lie_within_the_root_and_share_its_trace_and_resource() -> None:
    telemetry, exporter = traced()
    await scripted_request(telemetry, FakeClock())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans.pop("POST /v1/chat/completions")
    assert root.start_time is not None and root.end_time is not None
    for child in spans.values():
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert child.context.span_id != root.context.span_id
        assert child.start_time is not None and child.end_time is not None
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
        assert child.resource is root.resource
        assert child.instrumentation_scope == root.instrumentation_scope
    assert spans["chat llama"].kind is SpanKind.CLIENT
    assert [e.name for e in spans["chat llama"].events] == ["gen_ai.first_token"]


async def test_an_error_in_a_step_marks_its_span() -> None:
    telemetry, exporter = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                          headers={})
    try:
        with tel.step("routegate.rate_limit"):
            raise RuntimeError("over the limit")
    except RuntimeError:
        pass
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "RuntimeError"


def test_a_span_ends_once() -> None:
    received: list[ReadableSpan] = []
    sink = ChildSpans(received.append, None, None, lambda: 7)
    telemetry, _ = traced()
    root = telemetry.tracer.start_span("root")
    span = sink.start("child", root.get_span_context(), SpanKind.INTERNAL, {"a": [1, 2]})
    span.end()
    span.end()
    span.set_attribute("late", 1)
    assert len(received) == 1 and dict(received[0].attributes or {}) == {"a": (1, 2)}
