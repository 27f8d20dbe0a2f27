"""`Telemetry`: the app-wide objects (tracer provider, metrics, access log, live window)."""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import IO

from opentelemetry.trace import NoOpTracerProvider, TracerProvider

from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.light_span import ChildSpans
from gateway.telemetry.live import LiveStats
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record_span import RecordSpans
from gateway.telemetry.request import RequestTelemetry
from gateway.telemetry.span_pipe import SpanPipe
from gateway.telemetry.spans import tracer_of
from gateway.telemetry.timing import Clock, RequestTimings
from gateway.telemetry.tracing import tracer_provider_from_env


class Telemetry:
    """One per app; `begin()` one `RequestTelemetry` per request. Nothing is global."""

    def __init__(
        self,
        *,
        provider: TracerProvider | None = None,
        metrics: GatewayMetrics | None = None,
        access_log: AccessLog | None = None,
        live: LiveStats | None = None,
        clock: Clock | None = None,
    ) -> None:
        # The API's no-op provider: spans cost a few attribute look-ups, nothing exported.
        self.provider: TracerProvider = provider or NoOpTracerProvider()
        self.tracer = tracer_of(self.provider)
        # False: no spans at all, so a request builds none (`RequestTrace.untraced`)
        self.traced = not isinstance(self.provider, NoOpTracerProvider)
        # A request is recorded for the exporter process (`records`), else its spans are
        # light spans (`children`); neither: the no-op provider, or another SDK set-up.
        self.records = RecordSpans.for_tracer(self.tracer) if self.traced else None
        self.children: ChildSpans | None = (
            ChildSpans.for_tracer(self.tracer) if self.records is None else None)
        self.metrics = metrics or GatewayMetrics()
        self.access_log = access_log or AccessLog()
        self.live = live or LiveStats()
        self.clock: Clock = clock or perf_counter

    @classmethod
    def from_env(cls, env: Mapping[str, str], *,
                 access_stream: IO[bytes] | None = None) -> Telemetry:
        """What `routegate serve` uses: `OTEL_*` for traces; access lines to
        `access_stream` (buffered bytes) when given, else to logging."""
        return cls(
            provider=tracer_provider_from_env(env),
            access_log=AccessLog(stream=access_stream) if access_stream is not None else None,
        )

    def begin(
        self,
        *,
        request_id: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        record_content: bool = False,
        timings: RequestTimings | None = None,
        client: str | None = None,
    ) -> RequestTelemetry:
        return RequestTelemetry(
            self, request_id=request_id, method=method, path=path, headers=headers,
            record_content=record_content, timings=timings, client=client,
        )

    def dropped_spans(self) -> int:
        """Spans the trace export dropped so far (the exporter process's pipe; 0 else)."""
        processor = getattr(self.provider, "_active_span_processor", None)
        for inner in getattr(processor, "_span_processors", ()):
            if isinstance(inner, SpanPipe):
                return inner.dropped_spans
        return 0

    def shutdown(self) -> None:
        """Flush access lines still buffered and spans still batched (the SDK provider;
        the no-op one has nothing)."""
        self.access_log.flush()
        shutdown = getattr(self.provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
