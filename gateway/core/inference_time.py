"""Inference-only time as the backend itself reports it.

Each backend family reports it differently; this module reads all of them into
one `InferenceReport` (milliseconds). A field the backend did not report stays
`None`: inference time is never estimated from the gateway's own clock, so the
split "end-to-end vs inference" only ever shows figures somebody measured.

Sources, in the order later ones override earlier ones (the body's figures are
the most complete, because for a stream they are written after decoding ends):

- OpenAI: the `openai-processing-ms` response header (integer ms).
- TGI: `x-inference-time` (ms), `x-queue-time` (ms).
- local_backend: a `Server-Timing` header (`queue;dur=…, prefill;dur=…`, …), and a
  `timings` (or `metrics`) object in the final response / final stream chunk with
  `queue_ms, prefill_ms, ttft_ms, decode_ms, inference_ms, server_total_ms`.
- vLLM: a per-request `metrics` object (`time_in_queue`, `first_scheduled_time`,
  `first_token_time`, `finished_time`, … — seconds, timestamps in epoch seconds).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Server-Timing metric names a backend may use → our field names.
_SERVER_TIMING_FIELDS = {
    "queue": "queue_ms",
    "prefill": "prefill_ms",
    "ttft": "ttft_ms",
    "decode": "decode_ms",
    "inference": "inference_ms",
    "total": "server_total_ms",
    "server_total": "server_total_ms",
}
_MS_FIELDS = ("queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "inference_ms", "server_total_ms")
_DUR = re.compile(r"(?:^|;)\s*dur\s*=\s*\"?([0-9.eE+\-]+)\"?")


@dataclass(frozen=True, slots=True)
class InferenceReport:
    """What the backend said about its own time for one request (ms; None = not reported)."""

    queue_ms: float | None = None  # waiting inside the engine before the first forward pass
    prefill_ms: float | None = None
    ttft_ms: float | None = None  # engine arrival → first token
    decode_ms: float | None = None
    inference_ms: float | None = None  # prefill + decode: the model actually running
    server_total_ms: float | None = None  # engine arrival → response complete
    source: str | None = None  # which report the figures came from ("openai", "tgi", …)

    @property
    def known(self) -> bool:
        return any(getattr(self, name) is not None for name in _MS_FIELDS)

    def merged(self, newer: InferenceReport) -> InferenceReport:
        """Fields `newer` reports replace ours; fields it leaves out are kept."""
        if not newer.known:
            return self
        changes: dict[str, Any] = {
            name: getattr(newer, name) for name in _MS_FIELDS if getattr(newer, name) is not None
        }
        changes["source"] = newer.source if self.source in (None, newer.source) else (
            f"{self.source}+{newer.source}"
        )
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, float]:
        return {n: v for n in _MS_FIELDS if (v := getattr(self, n)) is not None}


UNKNOWN = InferenceReport()


def _number(value: object) -> float | None:
    """A finite, non-negative number, or None: a malformed report is no report."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def parse_server_timing(value: str) -> dict[str, float]:
    """`a;dur=1.5, b;desc="x";dur=2` → {"a": 1.5, "b": 2.0}; entries without dur are skipped."""
    out: dict[str, float] = {}
    for entry in value.split(","):
        name, _, params = entry.strip().partition(";")
        match = _DUR.search(params)
        if name and match and (dur := _number(match.group(1))) is not None:
            out[name.strip().lower()] = dur
    return out


_HEADER_NAMES = ("openai-processing-ms", "x-inference-time", "x-queue-time", "server-timing")


def from_headers(headers: Mapping[str, str]) -> InferenceReport:
    """Read whatever inference timing the upstream's response headers carry."""
    if hasattr(headers, "getall"):  # aiohttp's CIMultiDict: already case-insensitive
        for name in _HEADER_NAMES:
            if name in headers:
                break
        else:  # the usual case: a backend that reports nothing
            return UNKNOWN
        lower = {name: headers[name] for name in _HEADER_NAMES if name in headers}
    else:
        lower = {k.lower(): v for k, v in headers.items()}
        if not any(name in lower for name in _HEADER_NAMES):
            return UNKNOWN
    report = UNKNOWN
    if (ms := _number(lower.get("openai-processing-ms"))) is not None:
        report = report.merged(InferenceReport(server_total_ms=ms, source="openai"))
    tgi = InferenceReport(
        inference_ms=_number(lower.get("x-inference-time")),
        queue_ms=_number(lower.get("x-queue-time")),
        source="tgi",
    )
    report = report.merged(tgi)
    if "server-timing" in lower:
        metrics = parse_server_timing(lower["server-timing"])
        fields = {
            field: metrics[name] for name, field in _SERVER_TIMING_FIELDS.items() if name in metrics
        }
        report = report.merged(InferenceReport(**fields, source="server-timing"))
    return report


def _vllm_metrics(metrics: Mapping[str, Any]) -> InferenceReport:
    """vLLM's RequestMetrics: durations in seconds, points in time as epoch seconds."""

    def span_ms(start: str, end: str) -> float | None:
        a, b = _number(metrics.get(start)), _number(metrics.get(end))
        return (b - a) * 1000.0 if a is not None and b is not None and b >= a else None

    queue_s = _number(metrics.get("time_in_queue"))
    inference_ms = span_ms("first_scheduled_time", "last_token_time")
    if inference_ms is None:
        inference_ms = span_ms("first_scheduled_time", "finished_time")
    return InferenceReport(
        queue_ms=queue_s * 1000.0 if queue_s is not None else span_ms(
            "arrival_time", "first_scheduled_time"
        ),
        prefill_ms=span_ms("first_scheduled_time", "first_token_time"),
        ttft_ms=span_ms("arrival_time", "first_token_time"),
        decode_ms=span_ms("first_token_time", "last_token_time"),
        inference_ms=inference_ms,
        server_total_ms=span_ms("arrival_time", "finished_time"),
        source="vllm",
    )


def from_body(body: Mapping[str, Any]) -> InferenceReport:
    """Read a `timings`/`metrics` object from a final response or final stream chunk."""
    for key in ("timings", "metrics"):
        obj = body.get(key)
        if not isinstance(obj, Mapping):
            continue
        if any(name in obj for name in _MS_FIELDS):
            fields = {name: _number(obj.get(name)) for name in _MS_FIELDS}
            return InferenceReport(**fields, source="body")
        if "first_scheduled_time" in obj or "time_in_queue" in obj:
            return _vllm_metrics(obj)
    return UNKNOWN
