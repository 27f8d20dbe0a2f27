"""The per-request timing contract (metrics object, Server-Timing header) and its trace spans.

All instants come from the engine's monotonic clock. `prefill_ms + decode_ms ==
inference_ms` up to rounding, because all three derive from the same instants.
Spans are created here, on the event-loop side, after the fact, with explicit
start and end times; the engine thread never touches OpenTelemetry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from local_backend.engine.loop import RequestOutput
from local_backend.engine.sequence import Timings

_PROPAGATOR = TraceContextTextMapPropagator()
# (Server-Timing name, metrics key) in header order.
HEADER_FIELDS = (
    ("queue", "queue_ms"), ("prefill", "prefill_ms"), ("ttft", "ttft_ms"),
    ("decode", "decode_ms"), ("inference", "inference_ms"), ("total", "server_total_ms"),
)


def _ms(start: float | None, end: float | None) -> float:
    if start is None or end is None:
        return 0.0
    return round(max(end - start, 0.0) * 1000.0, 3)


def request_metrics(final: RequestOutput, end: float) -> dict[str, Any]:
    """The `metrics` object: durations in ms between the request's monotonic instants."""
    t = final.timings or Timings(arrival=end)
    first_token = t.first_token if t.first_token is not None else t.first_scheduled
    last_token = t.last_token if t.last_token is not None else first_token
    return {
        "queue_ms": _ms(t.arrival, t.first_scheduled),
        "prefill_ms": _ms(t.first_scheduled, first_token),
        "ttft_ms": _ms(t.arrival, first_token),
        "decode_ms": _ms(first_token, last_token),
        "inference_ms": _ms(t.first_scheduled, last_token),
        "server_total_ms": _ms(t.arrival, end),
        "prompt_tokens": final.prompt_tokens,
        "cached_tokens": final.cached_tokens,
        "completion_tokens": final.completion_tokens,
        "preemptions": final.preemptions,
    }


def server_timing(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{name};dur={metrics[key]}" for name, key in HEADER_FIELDS)


def inbound_context(headers: Mapping[str, str]) -> Context:
    return _PROPAGATOR.extract(carrier=dict(headers))


class SpanRecorder:
    """Turns a finished request's monotonic instants into spans under the inbound trace."""

    def __init__(self, tracer: trace.Tracer, clock_offset_ns: int | None = None) -> None:
        self.tracer = tracer
        # wall-clock ns = monotonic ns + offset, fixed once so spans keep their true order.
        self.offset_ns = (
            clock_offset_ns if clock_offset_ns is not None
            else time.time_ns() - time.monotonic_ns()
        )

    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self.offset_ns

    def record(
        self, parent: Context, name: str, final: RequestOutput | None, end: float,
        attributes: Mapping[str, Any],
    ) -> None:
        t = final.timings if final is not None else None
        if final is None or t is None:
            return
        root = self.tracer.start_span(
            name, context=parent, kind=trace.SpanKind.SERVER, start_time=self._ns(t.arrival),
            attributes={
                **attributes,
                "gen_ai.usage.input_tokens": final.prompt_tokens,
                "gen_ai.usage.output_tokens": final.completion_tokens,
                "gen_ai.response.finish_reasons": [final.finish_reason or "unknown"],
                "routegate.engine.cached_tokens": final.cached_tokens,
                "routegate.engine.preemptions": final.preemptions,
            },
        )
        inner = trace.set_span_in_context(root, parent)
        phases = (
            ("engine.queue", t.arrival, t.first_scheduled),
            ("engine.prefill", t.first_scheduled, t.first_token),
            ("engine.decode", t.first_token, t.last_token),
        )
        for span_name, start, stop in phases:
            if start is None or stop is None:
                continue
            span = self.tracer.start_span(span_name, context=inner, start_time=self._ns(start))
            span.end(end_time=self._ns(stop))
        root.end(end_time=self._ns(end))
