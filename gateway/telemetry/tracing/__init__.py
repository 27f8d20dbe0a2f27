"""Traces built from request records: sampling, the span builder, and the two ways
out (the exporter process, or the SDK's span processors)."""

from gateway.telemetry.tracing.setup import (
    SpanSink,
    Tracing,
    TracingConfigError,
    tracing_from_env,
)

__all__ = ["SpanSink", "Tracing", "TracingConfigError", "tracing_from_env"]
