"""The trace exporter process: request records in from gateways, OTLP/HTTP out.

    python -m gateway.telemetry.tracing.export_process FD [LISTENER_FD]

FD is this end of a Unix stream socket whose other end is held by whoever started
the process: a gateway (`SpanPipe`), or the supervisor of `serve --workers N`
(`shared_exporter.py`), which also passes LISTENER_FD, a listening Unix socket each
worker's `SpanPipe` connects to. `frames.py` says what travels on them;
`export_connections.py` serves them all at once.

Each frame's records become spans (`span_build.py`, as in the gateway for any other
exporter) and are encoded as the frame arrives (`OtlpEncoder`) into the one batch
being filled, whichever connection they came from, which is POSTed (`OtlpPoster`)
when full (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`) or when its oldest span has waited
`OTEL_BSP_SCHEDULE_DELAY`. The batch counts its spans by connection, so that each
gateway is told what became of its own. While a POST blocks, the gateways' writes
fill their sockets and they drop, never wait. End of file on FD (the gateway or the
supervisor exited, or shut down) exports what is left and exits."""

from __future__ import annotations

import logging
import marshal
import os
import pickle
import signal
import socket
import sys
import time
from collections import Counter
from typing import Any

from gateway.core.record import RequestRecord
from gateway.telemetry.tracing.export_connections import OWNER, READ_BYTES, Connections
from gateway.telemetry.tracing.frames import ACK, CONFIG, FLUSH, RECORDS, FrameBuffer, frame
from gateway.telemetry.tracing.otlp_encode import EncodedBatch, OtlpEncoder, Resource, Scope
from gateway.telemetry.tracing.otlp_post import ExportConfig, OtlpPoster
from gateway.telemetry.tracing.span_build import SCOPE_NAME, spans_of
from gateway.telemetry.tracing.trace_context import new_span_id

log = logging.getLogger("routegate.tracing.export")

EXPORTER_NICE = 10  # CPU priority below the gateway's (the Unix nice increment)


def exporter_config(export: ExportConfig, *, resource: dict[str, Any], schema_url: str,
                    max_batch_spans: int, schedule_delay_s: float) -> dict[str, Any]:
    """What the config frame carries (pickled), as `Exporter` reads it."""
    return {"export": vars(export), "resource": resource, "schema_url": schema_url,
            "max_batch_spans": max_batch_spans, "schedule_delay_s": schedule_delay_s}


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
        self._sources: Counter[int] = Counter()  # the open batch's spans, by connection
        # by connection: (exported, failed) spans the connection has not been told of
        self._unreported: dict[int, tuple[int, int]] = {}
        self.oldest = 0.0  # monotonic time the oldest pending record arrived
        self.exported = self.failed = 0

    @property
    def pending_spans(self) -> int:
        return self._open.spans

    def add(self, payload: bytes, source: int = OWNER) -> None:
        """One records frame from connection `source`."""
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
            self._sources[source] += len(spans)
        if self._open.spans >= self._batch:
            self.export()

    def due_in(self) -> float | None:
        """Seconds until the pending spans are due; None when nothing waits."""
        return self.oldest + self.delay_s - time.monotonic() if self._open.spans else None

    def export(self) -> None:
        """The batch being filled, as one request (at most a batch of spans)."""
        batch, self._open = self._open, EncodedBatch()
        sources, self._sources = self._sources, Counter()
        if not batch.spans:
            return
        took = self._post(self._encoder.request_of(batch, self._resource))
        if took:
            self.exported += batch.spans
        else:
            self.failed += batch.spans
        for source, spans in sources.items():
            exported, failed = self._unreported.get(source, (0, 0))
            self._unreported[source] = (exported + spans, failed) if took else (
                exported, failed + spans)

    def take_reports(self) -> dict[int, tuple[int, int]]:
        """By connection: (exported, failed) spans since the last call."""
        reports, self._unreported = self._unreported, {}
        return reports


def serve(sock: socket.socket, listener: socket.socket | None = None,
          post: Any = None) -> int:
    """Run until the end `sock` connects to closes; the exit status."""
    first = _config_frame(sock)
    if first is None:
        log.error("trace exporter: expected a config frame first")
        return 2
    config, owner_frames = first
    exporter = Exporter(config, post)
    connections = Connections(sock, owner_frames, listener)
    while True:
        # once the owner has closed, one more turn that waits for nothing takes what the
        # other connections have sent by then
        last = not connections.owner_open
        for connection, kind, payload in connections.frames(0.0 if last else exporter.due_in()):
            if kind == RECORDS:
                exporter.add(payload, connection.id)
            elif kind == FLUSH:
                exporter.export()
                # before the ack: a flush's drops are counted when it returns
                connections.report(exporter.take_reports())
                connections.send(connection, frame(ACK, payload))
        due = exporter.due_in()
        if due is not None and due <= 0:
            exporter.export()
        connections.report(exporter.take_reports())
        if last:
            break
    exporter.export()
    connections.report(exporter.take_reports())
    connections.close()
    if exporter.failed:
        log.warning("trace exporter: %d spans could not be exported", exporter.failed)
    return 0


def _config_frame(sock: socket.socket) -> tuple[dict[str, Any], FrameBuffer] | None:
    """The config the process starts with (blocking: nothing else is due before it),
    and the frames that came with it; None if the first frame is something else."""
    frames = FrameBuffer()
    while (popped := frames.pop()) is None:
        try:
            chunk = sock.recv(READ_BYTES)
        except ConnectionError:
            chunk = b""
        if not chunk:
            return None
        frames.feed(chunk)
    kind, payload = popped
    return (pickle.loads(payload), frames) if kind == CONFIG else None


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
    # Whoever started it decides when this ends (it closes its end); a Ctrl-C meant for
    # the gateway must not cut off the spans it flushes on the way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Background work: on a host with no idle core, serving requests comes first (if
    # this then falls behind, the gateway drops spans and counts them).
    os.nice(EXPORTER_NICE)
    lower_autogroup_priority()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    listener = socket.socket(fileno=int(args[1])) if len(args) > 1 else None
    with socket.socket(fileno=int(args[0])) as sock:
        sock.setblocking(True)
        return serve(sock, listener)


if __name__ == "__main__":
    sys.exit(main())
