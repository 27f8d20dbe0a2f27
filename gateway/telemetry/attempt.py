"""One upstream call as telemetry sees it: a CLIENT span, clock marks, what the stream says."""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span, Status, StatusCode

import gateway.telemetry.semconv as a
from gateway.telemetry.inference_time import from_body, from_headers
from gateway.telemetry.spans import mark_error

if TYPE_CHECKING:
    from gateway.telemetry.request import RequestTelemetry

# Compact JSON, as most OpenAI-compatible servers send it: counted with C-speed byte
# searches so a token stream is never parsed event by event.
_CONTENT = (b'"content":"', b'"text":"')
_EMPTY = (b'"content":""', b'"text":""')
# Python's json.dumps (some servers' chunks) writes a space after each colon.
_SPACED = b'": "'
_SPACED_CONTENT = (b'"content": "', b'"text": "')
_SPACED_EMPTY = (b'"content": ""', b'"text": ""')
_FINISH = re.compile(rb'"finish_reason":\s*"([A-Za-z_]{1,40})"')


def content_events(data: bytes) -> int:
    """Chunks in `data` whose delta carries non-empty text."""
    count = sum(data.count(m) for m in _CONTENT) - sum(data.count(m) for m in _EMPTY)
    if count or _SPACED not in data:
        return count
    return sum(data.count(m) for m in _SPACED_CONTENT) - sum(data.count(m) for m in _SPACED_EMPTY)


class UpstreamAttempt:
    __slots__ = ("_ended", "_first_token", "_req", "backend", "model", "span")

    def __init__(self, req: RequestTelemetry, span: Span, backend: str, model: str) -> None:
        self._req, self.span, self.backend, self.model = req, span, backend, model
        self._first_token = False
        self._ended = False

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add `traceparent` so the backend continues this trace under this span."""
        self._req.trace.inject(self.span, headers)

    def deadline(self, left_ms: int) -> None:
        """The request's budget left as this attempt was sent (`x-routegate-deadline-ms`)."""
        if self.span.is_recording():
            self.span.set_attribute(a.RG_DEADLINE_MS, left_ms)

    def responded(self, headers: Mapping[str, str], status: int = 200) -> None:
        """Upstream response headers arrived: first byte, and any timing they report."""
        timings = self._req.timings
        timings.upstream_first_byte()
        timings.report(from_headers(headers))
        if self.span.is_recording():
            self.span.set_attribute(a.HTTP_RESPONSE_STATUS_CODE, status)

    def token(self, count: int = 1) -> None:
        """Content-bearing chunks were relayed; the first is an event on the span."""
        self._req.timings.token(count)
        if not self._first_token:
            self._first_token = True
            if self.span.is_recording():
                self.span.add_event(a.EVENT_FIRST_TOKEN)

    def relayed(self, data: bytes) -> None:
        """One write of SSE bytes to the client: count tokens, note finish reasons."""
        count = content_events(data)
        if count > 0:
            self.token(count)
        if b'"finish_reason":"' in data or b'"finish_reason": "' in data:
            reasons = [m.decode() for m in _FINISH.findall(data)]
            self._req.finish_reasons.extend(reasons)

    def body(self, body: Mapping[str, Any]) -> None:
        """A JSON response, or a stream's final chunk: usage and backend-reported timings."""
        self._req.timings.report(from_body(body))
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            self._req.usage(
                input_tokens=usage.get("prompt_tokens", usage.get("input_tokens")),
                output_tokens=usage.get("completion_tokens", usage.get("output_tokens")),
            )
        choices = body.get("choices")
        if isinstance(choices, list):
            reasons = [c.get("finish_reason") for c in choices if isinstance(c, Mapping)]
            self._req.finish_reasons.extend(r for r in reasons if isinstance(r, str))
        if isinstance(body.get("model"), str):
            self._req.response_model = body["model"]
        if isinstance(body.get("id"), str):
            self._req.response_id = body["id"]

    def failed(self, error: BaseException | str, status: int | None = None) -> None:
        """The attempt failed; `status`: the backend's HTTP status, when it answered."""
        if isinstance(error, BaseException):
            mark_error(self.span, error)
        elif self.span.is_recording():
            # The statement only: what follows ": " is an exception's own text, which
            # may quote what the backend sent; a trace carries no content.
            self.span.set_attribute(a.ERROR_TYPE, error.partition(": ")[0][:200])
            self.span.set_status(Status(StatusCode.ERROR))
        if status is not None and self.span.is_recording():
            self.span.set_attribute(a.HTTP_RESPONSE_STATUS_CODE, status)
        self.end()

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._req.timings.upstream_ended()
        self._req.metrics.in_flight_of(self.backend).dec()
        self.span.end()
