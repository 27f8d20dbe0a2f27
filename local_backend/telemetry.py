"""Trace export for the server process, configured only from the standard OTEL_* variables."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter


def tracer_provider_from_env(env: dict[str, str] | None = None) -> TracerProvider | None:
    """A provider exporting over OTLP (or to the console), or None when nothing asks for one."""
    env = dict(os.environ) if env is None else env
    kind = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if kind == "none" or not (kind or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                              or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    exporter: SpanExporter
    if kind == "console":
        exporter = ConsoleSpanExporter()
    else:
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
        exporter = OTLPSpanExporter()
    service = env.get("OTEL_SERVICE_NAME", "routegate-local-backend")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def install(provider: TracerProvider | None) -> trace.Tracer:
    if provider is not None:
        trace.set_tracer_provider(provider)
    return trace.get_tracer("local_backend")
