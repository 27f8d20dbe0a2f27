"""One JSON line per request, for log pipelines.

The record is a closed set of fields (`AccessRecord`): when (RFC 3339, UTC, stamped
as the line is written), the client's address, identifiers, how the caller was
identified, the routing outcome, token counts, cost and every timing; a field with
no value is left out, never written empty. It has no field that could hold
prompt or completion text, headers or API keys, so none can leak into the log
by accident — adding one means changing this file, in review. What the client did
write into a field (the path, the model it asked for) is escaped: it cannot end the
line or write a terminal control.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import IO, Any, TypedDict

from gateway.core.log_text import json_line
from gateway.core.record import RequestRecord
from gateway.core.timing import TimingSplit

LOGGER_NAME = "routegate.access"


class AccessRecord(TypedDict):
    """One access line's fields, in the order they are written (a dict, not an object:
    one is made per request, and a dict display costs a fraction of a 22-argument
    constructor). `None` is "no value" and is left out of the line."""

    request_id: str
    method: str
    path: str
    status: int
    client: str | None  # the peer address
    trace_id: str | None
    tenant: str | None
    auth: str | None  # key | anonymous | unknown_key (a key it did not know)
    route: str | None
    backend: str | None
    model: str | None  # the backend model that served it
    stream: bool
    attempts: int
    decision_reason: str | None
    error_code: str | None
    input_tokens: int | None
    cached_tokens: int | None  # of input_tokens, from the backend's prefix cache
    replica: str | None  # the fleet replica that served it
    output_tokens: int | None
    cost_usd: float | None
    batch_id: str | None  # a Batch API line's batch
    timing: dict[str, float]


def access_record(record: RequestRecord) -> AccessRecord:
    """The access line of a finished request (never its content, headers or key)."""
    assert record.split is not None
    attempt = record.attempt
    return {
        "request_id": record.request_id, "method": record.method, "path": record.path,
        "status": record.status, "client": record.client, "trace_id": record.trace_id,
        "tenant": record.tenant, "auth": record.auth, "route": record.route,
        "backend": record.backend, "model": record.model, "stream": record.stream,
        "attempts": len(record.attempts), "decision_reason": record.reason,
        "error_code": record.error_code, "input_tokens": record.input_tokens,
        "cached_tokens": record.cached_input_tokens,
        "replica": attempt.replica if attempt is not None else None,
        "output_tokens": record.output_tokens, "cost_usd": record.cost_usd,
        "batch_id": record.batch_id, "timing": timing_of(record.split),
    }


def timing_of(split: TimingSplit) -> dict[str, float]:
    """Every timing figure we have, flat and in ms; unknown ones left out."""
    figures: dict[str, float | None] = {
        "total_ms": split.total_ms,
        "gw_ms": split.gw_ms,
        "queue_ms": split.queue_ms,
        "upstream_ms": split.upstream_ms,
        "upstream_first_byte_ms": split.upstream_first_byte_ms,
        "ttft_ms": split.ttft_ms,
        "inter_token_ms": split.inter_token_ms,
    }
    for name, value in split.inference.as_dict().items():
        figures[f"backend_{name}"] = value
    return {k: v for k, v in figures.items() if v is not None}


class AccessLog:
    """Writes `AccessRecord`s as JSON lines: to a binary `stream` when given (what
    `routegate serve` does), else to a `logging.Logger` at INFO (tests, embedding apps).

    The stream path skips the logging module (LogRecord, formatter, lock, a write and a
    flush per line: ~25 µs a request) and writes orjson's bytes to a buffered stream;
    `flush()` is called about once a second and at shutdown (`install_telemetry`), so a
    line reaches the log pipeline within ~1 s and a busy gateway makes one write(2) per
    buffer, not one per request.
    """

    def __init__(self, logger: logging.Logger | None = None, *,
                 stream: IO[bytes] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self.stream = stream
        self.clock = clock
        self._second = -1  # the second `_prefix` stands for
        self._prefix = ""

    def timestamp(self) -> str:
        """Now, RFC 3339 in UTC with milliseconds (`2026-12-02T01:36:45.123Z`); the date
        and time are formatted once a second."""
        now = self.clock()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((now - second) * 1000):03d}Z"

    @property
    def enabled(self) -> bool:
        """Whether `write` goes anywhere: callers skip building the record when not."""
        return self.stream is not None or self.logger.isEnabledFor(logging.INFO)

    def write(self, record: AccessRecord) -> None:
        stream = self.stream
        if stream is None and not self.logger.isEnabledFor(logging.INFO):
            return
        data: dict[str, Any] = {"time": self.timestamp()}
        data.update({name: value for name, value in record.items() if value is not None})
        # the path and the model are the client's: `json_line` leaves nothing raw in them
        # that could end the line or reach a terminal as a control
        line = json_line(data)
        if stream is not None:
            stream.write(line)
        else:
            self.logger.info(line[:-1].decode())

    def flush(self) -> None:
        if self.stream is not None:
            self.stream.flush()


def json_line_handler(stream: Any = None) -> logging.Handler:
    """A handler that prints the record's message alone: one JSON object per line."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler
