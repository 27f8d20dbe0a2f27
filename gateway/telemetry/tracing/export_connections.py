"""The exporter process's connections, served together with one selector.

The first is the one the process was started with: a gateway's own (`SpanPipe`
spawning its exporter), or the supervisor's of `serve --workers N`, which sends the
config and nothing else. Its end of file ends the process. With a listening socket
(`serve --workers N`), each worker's `SpanPipe` connects to it and is accepted here as
one more connection; its end of file only ends that connection.

Replies (acks, and the counts of spans exported or dropped) go out without waiting:
what a gateway has not read yet is kept, up to `MAX_UNSENT_BYTES`; past that the
gateway is stuck, and its connection is closed rather than the exporter waiting for
it (the gateway counts what it had sent as dropped, and reconnects).
"""

from __future__ import annotations

import logging
import selectors
import socket
from itertools import count

from gateway.telemetry.tracing.frames import DROPPED, EXPORTED, TOKEN, FrameBuffer, frame

log = logging.getLogger("routegate.tracing.export")

READ_BYTES = 1 << 20  # from one connection per wake-up, so a busy one cannot starve the rest
MAX_UNSENT_BYTES = 64 << 10  # replies a gateway has not read (each is 13 bytes)
OWNER = 0  # the id of the connection the process was started with


class Connection:
    """One gateway (or the supervisor): its socket, its frames, its unsent replies."""

    def __init__(self, id_: int, sock: socket.socket, frames: FrameBuffer) -> None:
        self.id, self.sock, self.frames = id_, sock, frames
        self.unsent = bytearray()
        self.waits_to_write = False  # registered for EVENT_WRITE too

    def write(self) -> bool:
        """Send what the socket takes now; False once the peer is gone or stuck."""
        if self.unsent:
            try:
                sent = self.sock.send(self.unsent)
            except BlockingIOError:
                sent = 0
            except OSError:
                return False
            del self.unsent[:sent]
        return len(self.unsent) <= MAX_UNSENT_BYTES


Frame = tuple[Connection, int, bytes]


class Connections:
    def __init__(self, owner: socket.socket, owner_frames: FrameBuffer,
                 listener: socket.socket | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        self._by_id: dict[int, Connection] = {}
        self._ids = count(OWNER + 1)
        first = self._add(OWNER, owner, owner_frames)
        # what arrived with the config frame, before any wake-up of the selector
        self._ready: list[Frame] = list(self._pop_all(first))
        self._listener = listener
        if listener is not None:
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ, None)

    @property
    def owner_open(self) -> bool:
        return OWNER in self._by_id

    def frames(self, timeout_s: float | None) -> list[Frame]:
        """The frames that arrived, in order for each connection, waiting up to
        `timeout_s` for the first (None: until something happens)."""
        ready, self._ready = self._ready, []
        events = self._selector.select(0.0 if ready else
                                       None if timeout_s is None else max(timeout_s, 0.0))
        for key, mask in events:
            connection = key.data
            if connection is None:
                self._accept()
                continue
            if mask & selectors.EVENT_WRITE:
                self._write(connection)
            if mask & selectors.EVENT_READ and connection.id in self._by_id:
                try:
                    chunk = connection.sock.recv(READ_BYTES)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self._close(connection)
                    continue
                connection.frames.feed(chunk)
                ready.extend(self._pop_all(connection))
        return ready

    def send(self, connection: Connection, data: bytes) -> None:
        if connection.id not in self._by_id:
            return  # closed since its frame arrived: nobody left to tell
        connection.unsent += data
        self._write(connection)

    def report(self, done: dict[int, tuple[int, int]]) -> None:
        """Tell each connection how many of its spans were exported and dropped;
        `done` is by connection id (closed connections' are let go)."""
        for id_, (exported, dropped) in done.items():
            connection = self._by_id.get(id_)
            if connection is None:
                continue
            reports = b""
            if dropped:
                reports += frame(DROPPED, TOKEN.pack(dropped))
            if exported:
                reports += frame(EXPORTED, TOKEN.pack(exported))
            if reports:
                self.send(connection, reports)

    def close(self) -> None:
        """Last replies as far as the sockets take them now, then every socket."""
        for connection in list(self._by_id.values()):
            connection.write()
            self._close(connection)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
        self._selector.close()

    def _add(self, id_: int, sock: socket.socket, frames: FrameBuffer) -> Connection:
        sock.setblocking(False)
        connection = Connection(id_, sock, frames)
        self._by_id[id_] = connection
        self._selector.register(sock, selectors.EVENT_READ, connection)
        return connection

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return  # gone again before it was accepted
        self._add(next(self._ids), sock, FrameBuffer())

    def _write(self, connection: Connection) -> None:
        if not connection.write():
            log.warning("trace exporter: a gateway does not read its replies; its "
                        "connection is closed")
            self._close(connection)
            return
        if bool(connection.unsent) != connection.waits_to_write:
            connection.waits_to_write = bool(connection.unsent)
            events = selectors.EVENT_READ | (
                selectors.EVENT_WRITE if connection.waits_to_write else 0)
            self._selector.modify(connection.sock, events, connection)

    def _close(self, connection: Connection) -> None:
        if self._by_id.pop(connection.id, None) is None:
            return
        self._selector.unregister(connection.sock)
        connection.sock.close()

    @staticmethod
    def _pop_all(connection: Connection) -> list[Frame]:
        found = []
        while (popped := connection.frames.pop()) is not None:
            found.append((connection, *popped))
        return found
