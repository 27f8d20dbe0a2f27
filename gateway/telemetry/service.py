"""`Telemetry`: the app-wide reporters of finished requests — metrics, the access log,
the dashboard's live window and the traces.

`begin()` opens a request's record (sampled, when traces are on); the pipeline fills
it; `finish()` fixes its timing split and hands the final record to every reporter,
once, whatever path the request took (answered, refused, cut off by a disconnect).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import time_ns
from typing import IO

import gateway.telemetry.semconv as a
from gateway.core.record import RequestRecord
from gateway.core.timing import MONOTONIC, Clock, RequestTimings
from gateway.telemetry.access_log import AccessLog, access_record
from gateway.telemetry.live import LiveWindow, Sample
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing.setup import Tracing, tracing_from_env
from gateway.telemetry.tracing.trace_context import inbound_trace_id

NO_TIMINGS = "a record finishes with its timings"


class Telemetry:
    """One per app. Nothing is global."""

    def __init__(
        self,
        *,
        tracing: Tracing | None = None,
        metrics: GatewayMetrics | None = None,
        access_log: AccessLog | None = None,
        live: LiveWindow | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.tracing = tracing  # None: no traces (an inbound traceparent still goes on)
        self.metrics = metrics or GatewayMetrics()
        self.access_log = access_log or AccessLog()
        self.live = live or LiveWindow()
        self.clock: Clock = clock or MONOTONIC

    @classmethod
    def from_env(cls, env: Mapping[str, str], *,
                 access_stream: IO[bytes] | None = None) -> Telemetry:
        """What `routegate serve` uses: `OTEL_*` for traces; access lines to
        `access_stream` (buffered bytes) when given, else to logging."""
        return cls(
            tracing=tracing_from_env(env),
            access_log=AccessLog(stream=access_stream) if access_stream is not None else None,
        )

    @property
    def new_span_id(self) -> Callable[[], int] | None:
        """The id generator's `generate_span_id`, for attempts' spans (None: untraced)."""
        tracing = self.tracing
        return tracing.sampling.ids.generate_span_id if tracing is not None else None

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
    ) -> RequestRecord:
        record = RequestRecord(request_id=request_id, method=method, path=path, client=client)
        record.timings = timings if timings is not None else RequestTimings(clock=self.clock)
        tracing = self.tracing
        if tracing is None:
            record.inbound_trace_id = inbound_trace_id(headers)
        else:
            record.trace = tracing.sampling.start(f"{method} {path}", headers, {
                a.HTTP_REQUEST_METHOD: method, a.HTTP_ROUTE: path, a.RG_REQUEST_ID: request_id})
            record.keeps_content = record_content and record.trace.sampled
        return record

    def finish(self, record: RequestRecord) -> None:
        """Fix the record's timing split and report it (once). `record.status` is final;
        0 means an unexpected exception, which the middleware answers with a 500."""
        if record.end_ns:
            return
        timings = record.timings
        assert timings is not None, NO_TIMINGS
        record.end_ns = time_ns()
        if not record.status:
            record.status = 500
        timings.finish()
        split = record.split = timings.split()
        record.gw_ms, record.queue_ms = split.gw_ms, split.queue_ms
        record.upstream_ms, record.total_ms = split.upstream_ms, split.total_ms
        record.ttft_ms, record.inference_ms = split.ttft_ms, split.inference_ms
        self.metrics.observe_record(record)
        live = self.live
        if record.rejection is not None:
            live.rejected(record.rejection)
        live.record(Sample(
            at_s=live.clock(), backend=record.backend or "", route=record.route or "",
            status=record.status, total_ms=split.total_ms, queue_ms=split.queue_ms,
            ttft_ms=split.ttft_ms, inference_ms=split.inference_ms, reason=record.reason,
            cost_usd=record.cost_usd or 0.0, cache=record.cache,
        ))
        if self.access_log.enabled:
            self.access_log.write(access_record(record))
        if self.tracing is not None and record.sampled:
            self.tracing.sink.export(record)

    def dropped_spans(self) -> int:
        """Spans the trace export dropped so far."""
        return self.tracing.sink.dropped_spans if self.tracing is not None else 0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.tracing.sink.force_flush(timeout_millis) if self.tracing else True

    def shutdown(self) -> None:
        """Flush access lines still buffered and spans still batched."""
        self.access_log.flush()
        if self.tracing is not None:
            self.tracing.sink.shutdown()
