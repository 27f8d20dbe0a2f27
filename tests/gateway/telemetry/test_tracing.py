from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry.tracing import (
    TracingConfigError,
    exporters_from_env,
    sampler_from_env,
    tracer_provider_from_env,
)
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, start_grpc


def test_nothing_configured_means_no_provider() -> None:
    assert tracer_provider_from_env({}) is None


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


def test_service_name_comes_from_otel_service_name() -> None:
    memory = InMemorySpanExporter()
    provider = tracer_provider_from_env(
        {"OTEL_SERVICE_NAME": "edge", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"},
        exporters=[memory],
    )
    assert provider is not None
    trace.get_tracer("t", tracer_provider=provider).start_span("s").end()
    provider.shutdown()
    (span,) = memory.get_finished_spans()
    assert span.resource.attributes["service.name"] == "edge"
    assert span.resource.attributes["deployment.environment"] == "test"


async def test_spans_reach_a_real_otlp_http_receiver(
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, url = otlp_receiver
    provider = tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                         "OTEL_SERVICE_NAME": "routegate-test"})
    assert provider is not None
    trace.get_tracer("t", tracer_provider=provider).start_span("exported").end()
    # The exporter blocks its thread on the receiver, which runs on this loop.
    await asyncio.to_thread(provider.force_flush)
    spans = await receiver.wait_for(lambda s: any(x.name == "exported" for x in s))
    assert spans[0].service == "routegate-test"
    await asyncio.to_thread(provider.shutdown)


async def test_spans_reach_a_real_otlp_grpc_receiver() -> None:
    receiver = OtlpReceiver()
    server, url = await start_grpc(receiver)
    try:
        provider = tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                             "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        assert provider is not None
        trace.get_tracer("t", tracer_provider=provider).start_span("over-grpc").end()
        await asyncio.to_thread(provider.force_flush)
        await receiver.wait_for(lambda s: any(x.name == "over-grpc" for x in s))
        await asyncio.to_thread(provider.shutdown)
    finally:
        await server.stop(None)


def test_an_unsampled_request_records_nothing_but_still_propagates_its_trace() -> None:
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from gateway.telemetry.spans import RequestTrace, tracer_of

    memory = InMemorySpanExporter()
    provider = SdkProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    request = RequestTrace(tracer_of(provider), name="POST /v1/chat/completions", headers={})
    with request.step("routegate.auth"):
        pass
    upstream = request.start_upstream("chat m")
    headers: dict[str, str] = {}
    request.inject(upstream, headers)
    upstream.end()
    request.end(200)
    assert memory.get_finished_spans() == ()
    _, trace_id, _, flags = headers["traceparent"].split("-")
    assert trace_id == request.trace_id
    assert int(flags, 16) & 1 == 0  # "not sampled": the backend must not record it either
