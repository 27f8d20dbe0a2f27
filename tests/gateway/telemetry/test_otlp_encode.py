"""The exporter process's OTLP encoder writes exactly what the OpenTelemetry exporter's
encoder writes for the same spans (the SDK's form of a record's spans, `sdk_sink.py`)."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway.core.record import RequestRecord, StepRecord
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from gateway.telemetry.tracing.otlp_encode import EncodedBatch, OtlpEncoder, Resource, Scope
from gateway.telemetry.tracing.sdk_sink import readable_spans
from gateway.telemetry.tracing.setup import sampler_from_env
from gateway.telemetry.tracing.span_build import SCOPE_NAME, spans_of
from gateway.telemetry.tracing.trace_context import Sampling
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.sampling import Kept
from tests.gateway.telemetry.scripted_request import scripted_request

INBOUND = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ATTRIBUTES = {"service.name": "routegate", "n": 3}


def ids() -> object:
    """Span ids in order, so both encoders see the same ones."""
    counter = iter(range(1, 1 << 20))
    return lambda: next(counter)


def ours(records: list[RequestRecord]) -> ExportTraceServiceRequest:
    encoder, batch, scope = OtlpEncoder(), EncodedBatch(), Scope(SCOPE_NAME, None, None)
    new_id = ids()
    for record in records:
        assert record.trace is not None
        encoder.add_spans(batch, record.trace.trace_id, dict(record.trace.trace_state) or None,
                          spans_of(record, new_id), scope)  # type: ignore[arg-type]
    return ExportTraceServiceRequest.FromString(
        encoder.request_of(batch, Resource(dict(ATTRIBUTES))))


def sdks(records: list[RequestRecord]) -> ExportTraceServiceRequest:
    resource, scope = SdkResource(dict(ATTRIBUTES)), InstrumentationScope(SCOPE_NAME)
    spans: list[ReadableSpan] = []
    new_id = ids()
    for record in records:
        spans += readable_spans(record, resource, scope, new_id)  # type: ignore[arg-type]
    return encode_spans(spans)


async def records(*headers: dict[str, str], status: int = 200) -> list[RequestRecord]:
    kept = Kept()
    telemetry = Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), kept))
    for inbound in headers:
        await scripted_request(telemetry, FakeClock(), headers=inbound, status=status)
    return kept.records


async def test_a_gateway_request_encodes_as_the_sdk_encodes_it() -> None:
    kept = await records({}, {"traceparent": INBOUND})  # events, decision lists, timings
    errors = await records({"traceparent": INBOUND}, status=503)  # remote parent, error
    assert ours(kept + errors) == sdks(kept + errors)


async def test_every_value_type_and_a_failed_step_encode_as_the_sdk() -> None:
    (record,) = await records({})
    record.steps.append(StepRecord("routegate.odd", record.start_ns, record.end_ns,
                                   error_type="ValueError", error_text="broken"))
    record.finish_reasons = ["stop", "length"]
    record.excluded = ("a/b: capability: tools", "c/d: region")
    record.temperature, record.max_tokens = 0.5, 2**40
    assert ours([record]) == sdks([record])


async def test_repeated_attribute_pairs_are_encoded_from_the_cache_identically() -> None:
    kept = await records({}, {}, {})
    assert ours(kept) == ours(kept) == sdks(kept)
