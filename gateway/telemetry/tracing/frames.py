"""The frames between gateways (`SpanPipe`) and the exporter process.

Each way, a frame is a 5-byte head (payload length, kind) and the payload:

    C  config: pickled dict (`export_process.exporter_config`), first on the connection
       the process was started with (a gateway's own, or the supervisor's of
       `serve --workers N`); gateway connections accepted later send none
    R  records: a marshalled list of request records (`RequestRecord.plain()`), each
       marshalled
    F  flush: 8-byte token; everything received before it on this connection is
       exported, then
    A  ack: the same token, back on the same connection
    D  dropped: 8-byte count, back to the gateway: its spans the collector refused or
       that could not be sent within the timeout (the gateway counts them)
    E  exported: 8-byte count, back to the gateway: its spans the collector took. With
       D, what the exporter process is done with; what it was sent and is not done
       with when it dies is lost, and the gateway counts that as dropped too
"""

from __future__ import annotations

import struct

HEAD = struct.Struct("<IB")
CONFIG, RECORDS, FLUSH, ACK, DROPPED, EXPORTED = (
    b"C"[0], b"R"[0], b"F"[0], b"A"[0], b"D"[0], b"E"[0])
TOKEN = struct.Struct("<Q")


def frame(kind: int, payload: bytes) -> bytes:
    return HEAD.pack(len(payload), kind) + payload


class FrameBuffer:
    """Frames out of a byte stream as it arrives: `feed` what was read, then `pop`
    (kind, payload) until it says None (the rest of a frame has not arrived)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def pop(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        if len(buffer) < HEAD.size:
            return None
        size, kind = HEAD.unpack_from(buffer)
        if len(buffer) < HEAD.size + size:
            return None
        payload = bytes(buffer[HEAD.size:HEAD.size + size])
        del buffer[:HEAD.size + size]
        return kind, payload
