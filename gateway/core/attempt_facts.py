"""One upstream attempt as it runs: its live side, and the writer of its facts into the
request record (the first byte, the tokens relayed, usage, finish reasons, the
backend's own timings, the outcome).

A request's attempts are one list, `RequestRecord.attempts`, of plain entries
(`AttemptRecord`). There is no second list of live objects beside it: the try in
progress (or the last one) is `RequestContext.attempt`, an `Attempt` holding what only
this process needs while it runs — the target, the failure object whose kind retries,
ejection and metrics read, whether the request's own deadline cut it — and its entry
in the record (`entry`), which it writes. Observers get each `Attempt` as it finishes
(`Observer.attempt_finished`); every later reader reads the record.

`Attempt.start` opens the entry once the attempt has its queue slot (and puts its
`traceparent` into the upstream headers); the relay then calls `responded`, `relayed`
and `body`, and the pipeline `failed` or `end`. Everything lands in the record and its
clock marks (`RequestTimings`); nothing here reports anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping
from time import time_ns
from typing import Any, Protocol

from gateway.core.content import StreamText, completion_text
from gateway.core.failures import UpstreamFailure
from gateway.core.inference_time import from_body, from_headers
from gateway.core.record import ERROR_TEXT_CHARS, AttemptRecord, RequestRecord
from gateway.core.timing import RequestTimings
from gateway.core.usage import cached_tokens, reported_tokens
from policies.load import ModelTarget

# Compact JSON, as most OpenAI-compatible servers send it: counted with C-speed byte
# searches so a token stream is never parsed event by event. Python's json.dumps (some
# servers' chunks) writes a space after each colon. `find`, not `in` (gateway/core/sse.py).
_SPACED = b'": "'
_FINISH = re.compile(rb'"finish_reason":\s*"([A-Za-z_]{1,40})"')


def content_events(data: bytes) -> int:
    """Chunks in `data` whose delta carries non-empty text."""
    count = (data.count(b'"content":"') + data.count(b'"text":"')
             - data.count(b'"content":""') - data.count(b'"text":""'))
    if count or data.find(_SPACED) < 0:
        return count
    return (data.count(b'"content": "') + data.count(b'"text": "')
            - data.count(b'"content": ""') - data.count(b'"text": ""'))


def note_usage(record: RequestRecord, usage: Mapping[str, Any]) -> None:
    """The counts a backend's usage reports (`gateway.core.usage`), where it reports them."""
    tokens_in, tokens_out = reported_tokens(usage)
    if tokens_in is not None:
        record.input_tokens = tokens_in
    cached = cached_tokens(usage)
    if cached is not None:
        record.cached_input_tokens = cached
    if tokens_out is not None:
        record.output_tokens = tokens_out


class Gauge(Protocol):
    """A gauge's series (the backend's in-flight count): what an attempt moves."""

    def inc(self, amount: float = 1.0) -> None: ...

    def dec(self, amount: float = 1.0) -> None: ...


class Attempt:
    """One try on one target: `entry` is its record entry, which it writes; `in_flight`
    is its backend's gauge."""

    __slots__ = ("_in_flight", "_record", "_stream_text", "_timings", "deadline_cut", "entry",
                 "failure", "target")

    def __init__(self, record: RequestRecord, entry: AttemptRecord, target: ModelTarget,
                 timings: RequestTimings, in_flight: Gauge) -> None:
        self._record, self.entry, self.target, self._timings = record, entry, target, timings
        self._in_flight = in_flight
        self._stream_text: StreamText | None = None
        # how it failed (before the answer, or a stream broken after bytes reached the
        # client): its kind says what the failure means
        self.failure: UpstreamFailure | None = None
        # it timed out because the request's own deadline ran out, not the backend's
        # timeout: the gateway's limit, so no mark against the target's health
        self.deadline_cut = False

    @classmethod
    def start(cls, record: RequestRecord, target: ModelTarget, timings: RequestTimings,
              in_flight: Gauge, headers: MutableMapping[str, str],
              new_span_id: Callable[[], int] | None = None) -> Attempt:
        """Open an attempt on `target`: the upstream clock, its gauge, and `traceparent`
        in `headers` (a sampled request's names this attempt's span; an unsampled one
        its root, flagged not sampled; without tracing the caller's goes as it came)."""
        entry = AttemptRecord(
            key=target.key, backend=target.backend_name, model=target.model_name,
            upstream_model=target.upstream_name or target.model_name,
            system=target.backend.type, number=len(record.attempts) + 1, start_ns=time_ns())
        record.attempts.append(entry)
        trace = record.trace
        if trace is not None:
            span_id = trace.span_id
            if trace.sampled and new_span_id is not None:
                span_id = entry.span_id = new_span_id()
            headers["traceparent"] = trace.traceparent(span_id)
            state = trace.tracestate()
            if state:
                headers["tracestate"] = state
        in_flight.inc()
        timings.upstream_started()
        return cls(record, entry, target, timings, in_flight)

    def left_ms(self, left_ms: int) -> None:
        """The request's budget left as this attempt was sent (`x-routegate-deadline-ms`)."""
        self.entry.deadline_ms = left_ms

    def responded(self, headers: Mapping[str, str], status: int = 200) -> None:
        """Upstream response headers arrived: first byte, and any timing they report."""
        timings = self._timings
        timings.upstream_first_byte()
        timings.report(from_headers(headers))
        self.entry.status = status

    def relayed(self, data: bytes) -> None:
        """SSE bytes about to be written to the client: tokens, finish reasons, text."""
        if not data:
            return
        count = content_events(data)
        if count > 0:
            self._timings.token(count)
            if not self.entry.first_token_ns:
                self.entry.first_token_ns = time_ns()
        if data.find(b'"finish_reason":"') >= 0 or data.find(b'"finish_reason": "') >= 0:
            self._record.finish_reasons.extend(m.decode() for m in _FINISH.findall(data))
        if self._record.keeps_content:
            if self._stream_text is None:
                self._stream_text = StreamText()
            self._stream_text.feed(data)
            self._record.completion = self._stream_text.text()

    def body(self, body: Mapping[str, Any] | None) -> None:
        """A JSON reply, or a stream's final chunk: usage and backend-reported timings."""
        if not body:
            return
        record = self._record
        self._timings.report(from_body(body))
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            note_usage(record, usage)
        choices = body.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                reason = choice.get("finish_reason") if isinstance(choice, dict) else None
                if isinstance(reason, str):
                    record.finish_reasons.append(reason)
        elif isinstance(body.get("stop_reason"), str):  # an Anthropic message, as it came
            record.finish_reasons.append(body["stop_reason"])
        if isinstance(body.get("model"), str):
            record.response_model = body["model"]
        if isinstance(body.get("id"), str):
            record.response_id = body["id"]

    def reply(self, body: Mapping[str, Any]) -> None:
        """A successful non-streamed JSON reply, parsed once by the relay."""
        self.body(body)
        if self._record.keeps_content:
            self._record.completion = completion_text(body)

    def failed(self, statement: str, status: int | None = None,
               reason: str | None = None) -> None:
        """The attempt failed (`reason`: its kind's metric reason). The span keeps the
        statement only: what follows ": " is an exception's own text, which may quote
        what the backend sent."""
        entry = self.entry
        entry.error, entry.failure = statement, reason
        entry.error_type = statement.partition(": ")[0][:ERROR_TEXT_CHARS]
        if status is not None:
            entry.status = status
        self.end()

    def broke(self, reason: str) -> None:
        """The stream this attempt was relaying broke after bytes reached the client
        (`reason`: the failure kind's metric reason); the attempt still answered."""
        self.entry.failure = reason

    def end(self) -> None:
        entry = self.entry
        if entry.ended:
            return
        entry.ended = True
        entry.end_ns = time_ns()
        self._timings.upstream_ended()
        self._in_flight.dec()
