"""The frames between the gateway (`SpanPipe`) and its exporter process.

Each way, a frame is a 5-byte head (payload length, kind) and the payload:

    C  config: pickled dict (ExportConfig fields, resource, batch settings)   first
    R  records: a marshalled list of request records (`RequestRecord.plain()`), each marshalled
    F  flush: 8-byte token; everything received before it is exported, then
    A  ack: the same token, back to the gateway
    D  dropped: 8-byte count, back to the gateway: spans the collector refused or
       that could not be sent within the timeout (the gateway counts them)
    E  exported: 8-byte count, back to the gateway: spans the collector took. With D,
       what the exporter process is done with; what it was sent and is not done with
       when it dies is lost, and the gateway counts that as dropped too
"""

from __future__ import annotations

import select
import socket
import struct

HEAD = struct.Struct("<IB")
CONFIG, RECORDS, FLUSH, ACK, DROPPED, EXPORTED = (
    b"C"[0], b"R"[0], b"F"[0], b"A"[0], b"D"[0], b"E"[0])
TOKEN = struct.Struct("<Q")
_READ_BYTES = 1 << 20
EOF = -1


def frame(kind: int, payload: bytes) -> bytes:
    return HEAD.pack(len(payload), kind) + payload


class FrameReader:
    """Frames from a blocking socket; `next(timeout_s)` is (kind, payload), (0, b"") on
    timeout, (EOF, b"") once the other end has closed."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock, self._buffer = sock, bytearray()

    def next(self, timeout_s: float | None) -> tuple[int, bytes]:
        buffer = self._buffer
        while True:
            if len(buffer) >= HEAD.size:
                size, kind = HEAD.unpack_from(buffer)
                if len(buffer) >= HEAD.size + size:
                    payload = bytes(buffer[HEAD.size:HEAD.size + size])
                    del buffer[:HEAD.size + size]
                    return kind, payload
            if timeout_s is not None:
                ready, _, _ = select.select([self._sock], [], [], max(timeout_s, 0.0))
                if not ready:
                    return 0, b""
            try:
                chunk = self._sock.recv(_READ_BYTES)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return EOF, b""
            buffer += chunk


