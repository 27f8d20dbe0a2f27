from __future__ import annotations

import asyncio

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing, TracingConfigError, tracing_from_env
from gateway.telemetry.tracing.setup import exporters_from_env, sampler_from_env
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, start_grpc
from tests.gateway.telemetry.scripted_request import scripted_request

ROOT_NAME = "POST /v1/chat/completions"


def test_nothing_configured_means_no_tracing() -> None:
    assert tracing_from_env({}) is None


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
    ],
)
def test_tracing_can_be_switched_off_explicitly(env: dict[str, str]) -> None:
    assert exporters_from_env(env) == []


def test_an_otlp_endpoint_alone_turns_on_http_export_to_its_traces_path() -> None:
    (exporter,) = exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"})
    assert isinstance(exporter, HttpExporter)
    assert exporter._endpoint == "http://127.0.0.1:4318/v1/traces"


def test_grpc_protocol_selects_the_grpc_exporter() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    (exporter,) = exporters_from_env(env)
    assert isinstance(exporter, GrpcExporter)


def test_unknown_protocol_fails_at_start_up() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "smoke"}
    with pytest.raises(TracingConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        exporters_from_env(env)


def test_sampler_follows_otel_traces_sampler() -> None:
    sampler = sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio",
                                "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert "0.25" in sampler.get_description()
    with pytest.raises(TracingConfigError):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "sometimes"})


async def test_service_name_comes_from_otel_service_name() -> None:
    memory = InMemorySpanExporter()
    tracing = tracing_from_env(
        {"OTEL_SERVICE_NAME": "edge", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"},
        exporters=[memory],
    )
    assert tracing is not None
    await scripted_request(Telemetry(tracing=tracing))
    tracing.sink.shutdown()
    span = next(s for s in memory.get_finished_spans() if s.name == ROOT_NAME)
    assert span.resource.attributes["service.name"] == "edge"
    assert span.resource.attributes["deployment.environment"] == "test"


async def test_spans_reach_a_real_otlp_http_receiver(
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, url = otlp_receiver
    tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                "OTEL_SERVICE_NAME": "routegate-test"})
    assert tracing is not None
    await scripted_request(Telemetry(tracing=tracing))
    # The exporter blocks its thread on the receiver, which runs on this loop.
    await asyncio.to_thread(tracing.sink.force_flush)
    spans = await receiver.wait_for(lambda s: any(x.name == ROOT_NAME for x in s))
    assert spans[0].service == "routegate-test"
    await asyncio.to_thread(tracing.sink.shutdown)


async def test_spans_reach_a_real_otlp_grpc_receiver() -> None:
    receiver = OtlpReceiver()
    server, url = await start_grpc(receiver)
    try:
        tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        assert tracing is not None
        await scripted_request(Telemetry(tracing=tracing))
        await asyncio.to_thread(tracing.sink.force_flush)
        await receiver.wait_for(lambda s: any(x.name == ROOT_NAME for x in s))
        await asyncio.to_thread(tracing.sink.shutdown)
    finally:
        await server.stop(None)


async def test_an_unsampled_request_records_nothing_but_still_propagates_its_trace() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    memory = InMemorySpanExporter()
    tracing = Tracing.to_processors([SimpleSpanProcessor(memory)], sampler=ALWAYS_OFF)
    headers: dict[str, str] = {}
    record = await scripted_request(Telemetry(tracing=tracing), injected=headers)
    assert memory.get_finished_spans() == ()
    assert record.steps == []  # nothing kept for spans nobody exports
    _, trace_id, _, flags = headers["traceparent"].split("-")
    assert trace_id == record.trace_id
    assert int(flags, 16) & 1 == 0  # "not sampled": the backend must not record it either
