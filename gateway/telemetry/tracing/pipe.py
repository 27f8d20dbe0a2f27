"""`SpanPipe`: the sink that hands finished request records to the exporter process.

The request path marshals each sampled request's record (`RequestRecord.plain()`)
into a bounded deque: marshalled at once, the record's objects are freed with it
instead of living on until the hand-off (which costs the garbage collector more than
the marshalling; `marshal` writes plain values faster than `pickle`, and both ends
run the same interpreter). The exporter process builds the spans. A hand-off thread
wakes every `handoff_s` (≤ 0.2 s), or as soon as `HANDOFF_RECORDS` requests are
waiting, joins what is there into one frame and writes it to a non-blocking Unix
socket whose other end is the exporter process (`export_process.py`), which encodes
and POSTs. Nothing here ever waits on the exporter: a full deque, a full socket or a
dead exporter drops the spans and counts them (`dropped_spans`, and a log line), as
the SDK's batch processor drops rather than blocks; the exporter process reports
back the spans it could not export (refused by the collector, or not sent within the
timeout), and they are counted the same way. The limits are the SDK's
(`OTEL_BSP_MAX_QUEUE_SIZE`, in spans, here divided by the spans of a request) plus
the socket's buffer and at most one partly written frame.

The exporter process starts with the first hand-off (shutdown's too), and again
`restart_after_s` after it died (not during shutdown). `force_flush` hands off what
is queued and waits for the process to say it has exported it; `shutdown` flushes, closes the socket
(end of file: the process exports what is left and exits) and waits for it.

A worker of `serve --workers N` starts no process of its own: it connects (`connect_to`)
to the one exporter process its supervisor runs (`shared_exporter.py`), in the same
turns as it would start one, and the same way: the first hand-off connects, and a lost
connection is tried again `restart_after_s` later, by the hand-off thread with a
non-blocking connect; the spans in between are dropped and counted. Its `shutdown`
flushes and closes only its connection.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from itertools import count
from typing import Any

from gateway.core.record import RequestRecord
from gateway.telemetry.tracing.export_process import exporter_config
from gateway.telemetry.tracing.frames import (
    ACK,
    CONFIG,
    DROPPED,
    EXPORTED,
    FLUSH,
    RECORDS,
    TOKEN,
    FrameBuffer,
    frame,
)
from gateway.telemetry.tracing.otlp_post import ExportConfig

log = logging.getLogger("routegate.tracing")

MARSHAL_VERSION = 4  # what `export_process` reads (the same interpreter)
HANDOFF_S = 0.2  # the longest a finished request's spans wait in the gateway process
# Requests handed off together at most: the exporter process encodes each frame as it
# arrives, so small frames spread its work (a batch's worth at once held a core for a while).
HANDOFF_RECORDS = 32
SOCKET_BUFFER_BYTES = 4 << 20  # what the exporter may fall behind by before drops
RESTART_AFTER_S = 5.0
# What a queue bound in spans (`OTEL_BSP_MAX_QUEUE_SIZE`) is in records: a request's
# root, auth, rate limit, route, queue wait and upstream attempt.
SPANS_PER_REQUEST = 6
STOP_TIMEOUT_S = 5.0


class SpanPipe:
    """The sink of a gateway exporting OTLP/HTTP from an exporter process: its own, or
    the one at `connect_to` (a Unix socket path)."""

    def __init__(self, export: ExportConfig, *, resource: dict[str, Any],
                 schema_url: str = "", max_queue_spans: int = 8192,
                 max_batch_spans: int = 2048, schedule_delay_s: float = 5.0,
                 handoff_s: float = HANDOFF_S, handoff_records: int = HANDOFF_RECORDS,
                 buffer_bytes: int = SOCKET_BUFFER_BYTES,
                 restart_after_s: float = RESTART_AFTER_S,
                 command: list[str] | None = None, connect_to: str | None = None) -> None:
        self._timeout_s = export.timeout_s
        self._config = exporter_config(export, resource=resource, schema_url=schema_url,
                                       max_batch_spans=max_batch_spans,
                                       schedule_delay_s=schedule_delay_s)
        self._address = connect_to
        self._queue: deque[tuple[int, bytes]] = deque()  # (spans, marshalled record)
        self._max_records = max(1, max_queue_spans // SPANS_PER_REQUEST)
        self._handoff_records = max(1, min(max_batch_spans // SPANS_PER_REQUEST,
                                           handoff_records))
        self._handoff_s = min(handoff_s, schedule_delay_s)
        self._buffer_bytes, self._restart_after_s = buffer_bytes, restart_after_s
        self._command = command or [sys.executable, "-m",
                                    "gateway.telemetry.tracing.export_process"]
        self.process: subprocess.Popen[bytes] | None = None  # our own exporter's
        self._sock: socket.socket | None = None
        self._down_since = -float("inf")  # when the exporter process was last lost
        self._tail = b""  # the unsent end of a partly written frame
        self._replies = FrameBuffer()  # frames from the exporter process, not yet read
        self._acked = 0  # the latest flush token the exporter process has answered
        self._tokens = count(1)
        self._dropped_queued = 0  # by the request path (one thread: the event loop's)
        self._dropped_handed = 0  # by hand-offs (under the lock)
        self._dropped_exporting = 0  # reported by the exporter process (under the lock)
        # Sent to the running exporter process and not yet reported exported or dropped:
        # lost, and counted as dropped, if it dies (under the lock)
        self._in_exporter = 0
        self._warned_at = -float("inf")
        self._lock = threading.Lock()  # the socket and the process
        self._wake = threading.Event()
        self._closed = self._closing = False
        self._thread = threading.Thread(target=self._run, name="routegate-span-pipe",
                                        daemon=True)
        self._thread.start()

    # the request path (event loop) ------------------------------------------
    def export(self, record: RequestRecord) -> None:
        """One sampled, finished request. Never waits."""
        queue = self._queue
        spans = 1 + len(record.steps) + len(record.attempts)
        if len(queue) >= self._max_records:
            self._dropped_queued += spans
            self._warn("the queue is full")
            return
        try:
            data = marshal.dumps(record.plain(), MARSHAL_VERSION)
        except (ValueError, TypeError, RecursionError):
            # an attribute value that is not a plain value: a bug of the caller's, which
            # costs its spans, never the request
            self._dropped_queued += spans
            self._warn("an attribute value cannot be sent to the exporter process")
            return
        queue.append((spans, data))
        if len(queue) == self._handoff_records:
            self._wake.set()

    # the hand-off thread ----------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._handoff_s)
            self._wake.clear()
            self.hand_off()

    def hand_off(self) -> None:
        """Write what is queued as one frame, or drop it."""
        queue = self._queue
        size = len(queue)
        if not size:
            if self._sock is not None:
                with self._lock:  # gone idle: count what it held now, not at the next span
                    self._read_replies()
            return
        items = [queue.popleft() for _ in range(size)]
        with self._lock:
            if not self._alive():
                self._drop(sum(spans for spans, _ in items), "the exporter process is not running")
                return
            self._read_replies()
            if self._sock is None:
                self._drop(sum(spans for spans, _ in items), "the exporter process has gone")
                return
            spans = sum(spans for spans, _ in items)
            frame_data = marshal.dumps([data for _, data in items], MARSHAL_VERSION)
            if self._send(frame(RECORDS, frame_data)):
                self._in_exporter += spans
            else:
                self._drop(spans, "the exporter process is behind")

    def _read_replies(self) -> None:
        """Read what the exporter process has said (under the lock): flush acks, and the
        spans it could not export, which count as dropped."""
        sock = self._sock
        if sock is not None and not self._take_reports(sock):
            self._gone()

    def _take_reports(self, sock: socket.socket) -> bool:
        """Read and apply what has arrived from the exporter process; False once it has
        closed its end."""
        replies, open_ = self._replies, True
        while True:
            try:
                chunk = sock.recv(4096)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                open_ = False
                break
            replies.feed(chunk)
        while (reply := replies.pop()) is not None:
            kind, payload = reply
            if kind not in (ACK, DROPPED, EXPORTED) or len(payload) != TOKEN.size:
                continue
            value = TOKEN.unpack(payload)[0]
            if kind == ACK:
                self._acked = max(self._acked, value)
            else:
                self._in_exporter = max(0, self._in_exporter - value)
                if kind == DROPPED and value:
                    self._dropped_exporting += value
                    self._warn("the collector refused them or did not answer in time")
        return open_

    def _send(self, data: bytes) -> bool:
        """Write `data` whole or not at all (a partly written frame finishes first)."""
        sock = self._sock
        assert sock is not None
        try:
            if self._tail:
                self._tail = self._tail[sock.send(self._tail):]
                if self._tail:
                    return False
            sent = sock.send(data)
        except BlockingIOError:
            return False
        except OSError:  # the exporter process has gone
            self._gone()
            return False
        self._tail = data[sent:]
        return True

    def _alive(self) -> bool:
        process = self.process
        if process is not None and process.poll() is not None:
            self._gone()
        # During shutdown a dead exporter is not restarted; one never started yet (the
        # gateway stopped before its first hand-off) starts, or its spans would be lost.
        if (self._sock is None
                and (not self._closing or self._down_since == -float("inf"))
                and time.monotonic() - self._down_since >= self._restart_after_s):
            if self._address is None:
                self._start()
            else:
                self._connect(self._address)
        return self._sock is not None

    def _connect(self, address: str) -> None:
        """To the shared exporter process. Non-blocking: a Unix socket's connect is
        taken at once, or refused (nobody listening, or its backlog full)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._buffer_bytes)
            sock.setblocking(False)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            self._down_since = time.monotonic()
            log.warning("trace exporter at %s unreachable (%s); spans are dropped until "
                        "it answers (tried again in %.0f s)", address, exc,
                        self._restart_after_s)
            return
        self._sock, self._tail, self._replies = sock, b"", FrameBuffer()

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._buffer_bytes)
            self.process = subprocess.Popen(
                [*self._command, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            mine.close()
            self._down_since = time.monotonic()
            log.warning("trace exporter process could not start (%s); spans are dropped", exc)
            return
        finally:
            theirs.close()
        mine.sendall(frame(CONFIG, pickle.dumps(self._config)))
        mine.setblocking(False)
        self._sock, self._tail, self._replies = mine, b"", FrameBuffer()

    def _gone(self) -> None:
        process, self.process = self.process, None
        self._down_since = time.monotonic()
        if self._sock is not None:
            self._take_reports(self._sock)  # its last reports settle what it had
            self._sock.close()
            self._sock = None
        lost, self._in_exporter = self._in_exporter, 0
        if lost:  # handed over, never reported exported or dropped: died with it
            self._drop(lost, "the exporter process died holding them")
        if process is None:
            log.warning("connection to the trace exporter at %s lost; spans are dropped "
                        "until it is back (tried again in %.0f s)", self._address,
                        self._restart_after_s)
        else:
            code = process.poll()
            if code is None:  # alive but its socket is not: of no use any more
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1.0)  # reaped, not left a zombie
            log.warning("trace exporter process exited (%s); spans are dropped until it "
                        "restarts (within %.0f s)", code if code is not None else "socket closed",
                        self._restart_after_s)

    @property
    def dropped_spans(self) -> int:
        """Spans lost so far: queue full, exporter behind (socket full) or not running,
        and those the exporter process could not export (refused, or timed out)."""
        return self._dropped_queued + self._dropped_handed + self._dropped_exporting

    def _drop(self, spans: int, why: str) -> None:
        self._dropped_handed += spans
        self._warn(why)

    def _warn(self, why: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10.0:  # visible, but not a line per request
            self._warned_at = now
            log.warning("dropped spans (%s): %d so far", why, self.dropped_spans)

    # flush and shutdown (not on the event loop) -------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand off what is queued and wait until the exporter process has exported it."""
        deadline = time.monotonic() + timeout_millis / 1000.0
        self.hand_off()
        with self._lock:
            sock = self._sock
            if sock is None or not self._drain(sock, deadline):
                return not self._queue and sock is None and self.process is None
            token = next(self._tokens)
            data = frame(FLUSH, TOKEN.pack(token))
            self._tail = data
            if not self._drain(sock, deadline):
                return False
            return self._wait_for_ack(sock, token, deadline)

    def _drain(self, sock: socket.socket, deadline: float) -> bool:
        """Finish writing the partly written frame, waiting up to `deadline`."""
        while self._tail:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            _, writable, _ = select.select([], [sock], [], remaining)
            if writable:
                try:
                    self._tail = self._tail[sock.send(self._tail):]
                except BlockingIOError:
                    continue
                except OSError:
                    self._gone()
                    return False
        return True

    def _wait_for_ack(self, sock: socket.socket, token: int, deadline: float) -> bool:
        while True:
            self._read_replies()
            if self._acked >= token:
                return True
            if self._sock is not sock:  # gone while waiting
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([sock], [], [], remaining)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closing = True  # a dead exporter is not restarted now
        self.force_flush()
        self._closed = True
        self._wake.set()
        self._thread.join(STOP_TIMEOUT_S)
        with self._lock:
            process, sock = self.process, self._sock
            self.process = self._sock = None
        if sock is not None:
            sock.close()  # end of file: the exporter exports what is left and exits
        if process is not None:
            try:
                process.wait(STOP_TIMEOUT_S + self._timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.dropped_spans:
            log.warning("%d spans were dropped in all", self.dropped_spans)
