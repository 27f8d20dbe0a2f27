"""A backend written in raw asyncio that answers each request with whatever bytes a test
scripts, framing faults included (interim 1xx heads, bad chunk sizes, trickled heads,
junk after a body, an early close), since no HTTP server library would send them."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pause:
    """Flush what was written, then wait `seconds`."""

    seconds: float


CLOSE = object()  # end the connection here (a FIN)
RESET = object()  # end it with a reset (RST)

Piece = bytes | Pause | object
Script = Callable[[bytes], Sequence[Piece]]  # the request's body → what to send back


def answer(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    """A whole response with a Content-Length."""
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"%b\r\n%b" % (status, len(body), extra, body))


class RawBackend:
    """`url = await start()`; `script(request_body)` gives each answer's pieces."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests = 0
        self.answered = 0  # requests whose script has run to its end
        self._progress = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()

    async def until_answered(self, count: int) -> None:
        """Until the scripts of `count` requests have run to their end."""
        while self.answered < count:
            self._progress.clear()
            await self._progress.wait()

    async def _answer(self, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Send the scripted answer; False when it ended the connection."""
        for piece in self.script(body):
            if piece is CLOSE:
                await writer.drain()
                return False
            if piece is RESET:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            if isinstance(piece, Pause):
                await writer.drain()
                await asyncio.sleep(piece.seconds)
            elif isinstance(piece, bytes):
                writer.write(piece)
        await writer.drain()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                self.requests += 1
                try:
                    if not await self._answer(body, writer):
                        return
                finally:
                    self.answered += 1
                    self._progress.set()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
