from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import COMPLETION, PROMPT, scripted_request

INBOUND_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INBOUND = f"00-{INBOUND_TRACE}-00f067aa0ba902b7-01"


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(spans: InMemorySpanExporter, clock: FakeClock) -> Telemetry:
    return Telemetry(tracing=Tracing.to_processors([SimpleSpanProcessor(spans)]), clock=clock,
                     access_log=AccessLog(logging.getLogger("test.access")))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_one_root_server_span_with_a_child_per_step(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock)
    finished = {s.name: s for s in spans.get_finished_spans()}
    root = finished["POST /v1/chat/completions"]
    assert root.kind is SpanKind.SERVER
    assert root.parent is None
    children = ["routegate.auth", "routegate.rate_limit", "routegate.route", "routegate.queue.wait",
                "chat llama"]
    for name in children:
        parent = finished[name].parent
        assert parent is not None and parent.span_id == root.context.span_id, name
        assert finished[name].context.trace_id == root.context.trace_id
    assert len(finished) == len(children) + 1


async def test_upstream_span_is_a_client_span_with_a_first_token_event(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock)
    (upstream,) = [s for s in spans.get_finished_spans() if s.name == "chat llama"]
    assert upstream.kind is SpanKind.CLIENT
    assert [e.name for e in upstream.events] == ["gen_ai.first_token"]
    assert attrs(upstream)["gen_ai.system"] == "openai"


async def test_root_span_carries_gen_ai_and_routegate_attributes(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock)
    root = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER)
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "chat"
    assert attrs["gen_ai.response.model"] == "llama-served"
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["routegate.tenant"] == "acme"
    assert attrs["routegate.route"] == "chat"
    assert attrs["routegate.backend"] == "local"
    assert attrs["routegate.decision.id"] == "d-1"
    assert attrs["routegate.decision.reason"] == "cheapest"
    assert attrs["routegate.predicted.ttft_ms"] == 90.0
    assert attrs["routegate.actual.ttft_ms"] == pytest.approx(57)
    assert attrs["routegate.queue.wait_ms"] == pytest.approx(5)
    assert attrs["routegate.timing.inference_ms"] == 55.5
    assert attrs["http.response.status_code"] == 200


async def test_route_span_carries_the_decision(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock)
    route = next(s for s in spans.get_finished_spans() if s.name == "routegate.route")
    assert attrs(route)["routegate.backend"] == "local"
    assert attrs(route)["routegate.decision.candidates"] == ("local/llama",)


async def test_inbound_traceparent_is_continued_and_injected_upstream(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    injected: dict[str, str] = {}
    tel = await scripted_request(telemetry, clock, headers={"traceparent": INBOUND},
                                 injected=injected)
    assert tel.trace_id == INBOUND_TRACE
    upstream = next(s for s in spans.get_finished_spans() if s.name == "chat llama")
    _version, trace_id, parent_id, _flags = injected["traceparent"].split("-")
    assert trace_id == INBOUND_TRACE
    # The backend's spans hang under our CLIENT span.
    assert parent_id == f"{upstream.context.span_id:016x}"
    root = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert root.parent is not None and f"{root.parent.span_id:016x}" == "00f067aa0ba902b7"


async def test_without_tracing_inbound_traceparent_is_still_forwarded(clock: FakeClock) -> None:
    injected: dict[str, str] = {}
    tel = await scripted_request(Telemetry(clock=clock), clock, headers={"traceparent": INBOUND},
                                 injected=injected)
    assert injected["traceparent"] == INBOUND
    assert tel.trace_id == INBOUND_TRACE


async def test_prompt_and_completion_are_not_recorded_by_default(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock)
    text = repr([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert PROMPT not in text and COMPLETION not in text


async def test_policy_record_content_puts_prompt_and_completion_on_the_root_span(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock, record_content=True)
    root = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert attrs(root)["gen_ai.prompt"] == PROMPT
    assert attrs(root)["gen_ai.completion"] == COMPLETION


async def test_server_error_marks_the_root_span_as_error(
    telemetry: Telemetry, spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    await scripted_request(telemetry, clock, status=502)
    root = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert not root.status.is_ok
    assert attrs(root)["error.type"] == "502"


async def test_server_timing_adds_up_and_carries_backend_inference(
    telemetry: Telemetry, clock: FakeClock
) -> None:
    tel = await scripted_request(telemetry, clock)
    split = tel.split
    assert split is not None
    assert split.gw_ms + split.queue_ms + split.upstream_ms == pytest.approx(split.total_ms, abs=1)
    assert split.queue_ms == pytest.approx(5)
    assert split.upstream_ms == pytest.approx(70)
    assert split.inference_ms == 55.5
    assert "inference;dur=55.500" in split.server_timing()


async def test_access_log_is_one_json_line_with_ids_outcome_and_every_timing(
    telemetry: Telemetry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.access")
    tel = await scripted_request(telemetry, clock, headers={"traceparent": INBOUND})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "test.access"]
    record = orjson.loads(line)
    assert record["request_id"] == "req-1"
    assert record["trace_id"] == INBOUND_TRACE == tel.trace_id
    assert (record["tenant"], record["route"], record["backend"]) == ("acme", "chat", "local")
    assert (record["status"], record["input_tokens"], record["output_tokens"]) == (200, 12, 3)
    assert record["cost_usd"] == 0.0021
    assert set(record["timing"]) >= {"total_ms", "gw_ms", "queue_ms", "upstream_ms", "ttft_ms",
                                     "upstream_first_byte_ms", "backend_inference_ms"}


async def test_access_log_never_contains_prompt_text_even_when_content_is_recorded(
    telemetry: Telemetry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await scripted_request(telemetry, clock, record_content=True)
    assert PROMPT not in caplog.text and COMPLETION not in caplog.text


async def test_finish_is_recorded_once(
    telemetry: Telemetry, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.access")
    tel = await scripted_request(telemetry, clock)
    total_ms = tel.total_ms
    tel.status = 499
    telemetry.finish(tel)
    assert tel.total_ms == total_ms and tel.status == 499
    assert len([r for r in caplog.records if r.name == "test.access"]) == 1
