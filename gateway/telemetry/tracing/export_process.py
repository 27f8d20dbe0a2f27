"""The trace exporter process: request records in from the gateway, OTLP/HTTP out.

    python -m gateway.telemetry.tracing.export_process FD

FD is this end of a Unix stream socket the gateway (`SpanPipe`) holds the other
end of; `frames.py` says what travels on it.

Each frame's records become spans (`span_build.py`, as in the gateway for any other
exporter) and are encoded as the frame arrives (`OtlpEncoder`) into the batch being
filled, which is POSTed (`OtlpPoster`) when full (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`)
or when its oldest span has waited `OTEL_BSP_SCHEDULE_DELAY`. While a POST blocks,
the gateway's writes fill the socket and it drops, never waits. End of file (the
gateway exited, or shut down) exports what is left and exits."""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import signal
import socket
import sys
import time
from typing import Any

from gateway.pipeline.record import RequestRecord
from gateway.telemetry.tracing.frames import (
    ACK,
    CONFIG,
    DROPPED,
    EOF,
    EXPORTED,
    FLUSH,
    RECORDS,
    TOKEN,
    FrameReader,
    frame,
)
from gateway.telemetry.tracing.otlp_encode import EncodedBatch, OtlpEncoder, Resource, Scope
from gateway.telemetry.tracing.otlp_post import ExportConfig, OtlpPoster
from gateway.telemetry.tracing.span_build import SCOPE_NAME, spans_of
from gateway.telemetry.tracing.trace_context import new_span_id

log = logging.getLogger("routegate.tracing.export")

EXPORTER_NICE = 10  # CPU priority below the gateway's (the Unix nice increment)


class Exporter:
    """Encodes records as they arrive and exports them in batches; `post` is the seam
    (an `OtlpPoster` by default).

    A frame's records are encoded at once, into the batch being filled: the work
    follows the gateway's pace in small steps instead of one burst per batch, which
    held a core for ~10 ms every batch and slowed the requests in flight then."""

    def __init__(self, config: dict[str, Any], post: Any = None) -> None:
        export = ExportConfig(**config["export"])
        self._post = post or OtlpPoster(export).post
        self._resource = Resource(config["resource"], config.get("schema_url") or "")
        self._scope = Scope(SCOPE_NAME, None, None)
        self._encoder = OtlpEncoder()
        self._batch = max(1, int(config["max_batch_spans"]))
        self.delay_s = float(config["schedule_delay_s"])
        self._open = EncodedBatch()
        self.oldest = 0.0  # monotonic time the oldest pending record arrived
        self.exported = self.failed = 0

    @property
    def pending_spans(self) -> int:
        return self._open.spans

    def add(self, payload: bytes) -> None:
        if not self._open.spans:
            self.oldest = time.monotonic()
        # the frame: a marshalled list of marshalled records (`marshal.load` from a
        # stream reads a few bytes at a time, ~25x slower than `loads` of a record)
        for data in marshal.loads(payload):
            record = RequestRecord.from_plain(marshal.loads(data))
            spans = spans_of(record, new_span_id)
            if self._open.spans and self._open.spans + len(spans) > self._batch:
                self.export()  # full: this record opens the next batch
                self.oldest = time.monotonic()
            assert record.trace is not None
            self._encoder.add_spans(self._open, record.trace.trace_id,
                                    dict(record.trace.trace_state) or None, spans, self._scope)
        if self._open.spans >= self._batch:
            self.export()

    def due_in(self) -> float | None:
        """Seconds until the pending spans are due; None when nothing waits."""
        return self.oldest + self.delay_s - time.monotonic() if self._open.spans else None

    def export(self) -> None:
        """The batch being filled, as one request (at most a batch of spans)."""
        batch, self._open = self._open, EncodedBatch()
        if not batch.spans:
            return
        if self._post(self._encoder.request_of(batch, self._resource)):
            self.exported += batch.spans
        else:
            self.failed += batch.spans


def serve(sock: socket.socket, post: Any = None) -> int:
    """Run until the gateway's end closes; the exit status."""
    frames = FrameReader(sock)
    kind, payload = frames.next(None)
    if kind != CONFIG:
        log.error("trace exporter: expected a config frame, got %r", kind)
        return 2
    exporter = Exporter(pickle.loads(payload), post)
    reported_failed = reported_exported = 0  # what the gateway has been told

    def report_failures() -> None:
        """Tell the gateway what is done with: failed (dropped) and exported spans."""
        nonlocal reported_failed, reported_exported
        reports = b""
        if exporter.failed > reported_failed:
            reports += frame(DROPPED, TOKEN.pack(exporter.failed - reported_failed))
        if exporter.exported > reported_exported:
            reports += frame(EXPORTED, TOKEN.pack(exporter.exported - reported_exported))
        if not reports:
            return
        try:
            sock.sendall(reports)
        except OSError:  # the gateway has gone: nobody left to tell
            return
        reported_failed, reported_exported = exporter.failed, exporter.exported

    while True:
        kind, payload = frames.next(exporter.due_in())
        if kind == RECORDS:
            exporter.add(payload)
        elif kind == FLUSH:
            exporter.export()
            report_failures()  # before the ack: a flush's drops are counted when it returns
            sock.sendall(frame(ACK, payload))
        elif kind == EOF:
            break
        due = exporter.due_in()
        if due is not None and due <= 0:
            exporter.export()
            report_failures()
    if exporter.pending_spans:
        exporter.export()
        report_failures()
    if exporter.failed:
        log.warning("trace exporter: %d spans could not be exported", exporter.failed)
    return 0


def lower_autogroup_priority(path: str = "/proc/self/autogroup") -> bool:
    """Give this process's scheduler autogroup the exporter's nice value too.

    This process runs in a session of its own (a Ctrl-C for the gateway must not cut
    its flush short), and where the kernel groups tasks by session (Linux autogroup),
    a process's own nice value only ranks it within its session: against the gateway
    and everything else it would still get an equal share of a busy core. False where
    there is no autogroup (another OS, autogroup off, a cgroup-managed service)."""
    try:
        with open(path, "w") as autogroup:
            autogroup.write(str(EXPORTER_NICE))
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # The gateway decides when this ends (it closes its end); a Ctrl-C meant for it must
    # not cut off the spans it flushes on the way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Background work: on a host with no idle core, serving requests comes first (if
    # this then falls behind, the gateway drops spans and counts them).
    os.nice(EXPORTER_NICE)
    lower_autogroup_priority()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    with socket.socket(fileno=int(args[0])) as sock:
        sock.setblocking(True)
        return serve(sock)


if __name__ == "__main__":
    sys.exit(main())
