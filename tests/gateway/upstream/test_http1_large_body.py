"""Large request bodies: written under the transport's flow control, so a backend that
reads slowly holds the request back (not the gateway's memory), `first_byte_s` starts
once the body is written, and `total_s` covers the writing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.upstream.http1 import LARGE_BODY_BYTES, Http1Client, Timeouts

MIB = 1 << 20
STEP = 256 * 1024


class SlowBackend:
    """A raw HTTP/1.1 backend with a small receive buffer (so the kernel holds little of
    a request). Per connection, per request: "slow" reads the first half of the body in
    256 KiB steps with a pause after each, the rest at once, and answers with the body's
    length and the number of distinct byte values; "stall" reads only the head and never
    the body, until `release` is set, then counts what arrives before the connection
    ends; "early" reads only the head and answers 413 at once, keeping the connection
    open without reading the body until `release` is set."""

    def __init__(self, script: list[str], pause_s: float = 0.015) -> None:
        self.script = script
        self.pause_s = pause_s
        self.connections = 0
        self.release = asyncio.Event()
        self.stalled_got: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> str:
        listener = socket.socket()
        # accepted connections inherit the small receive buffer
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        self.server = await asyncio.start_server(self.serve, sock=listener, limit=64 * 1024)
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        return self.url

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        action = self.script[self.connections]
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if action == "early":
                    refusal = b'{"error": {"message": "too large"}}'
                    writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: %d\r\n"
                                 b"\r\n%b" % (len(refusal), refusal))
                    await writer.drain()
                    await self.release.wait()
                    return
                if action == "stall":
                    await self.release.wait()
                    self.stalled_got.set_result(await _read_to_the_end(reader))
                    return
                got = bytearray()
                while len(got) < length:
                    step = min(STEP, length - len(got))
                    got += await reader.readexactly(step if len(got) < length // 2 else
                                                    length - len(got))
                    if len(got) < length // 2:
                        await asyncio.sleep(self.pause_s)
                answer = orjson.dumps({"length": len(got), "values": len(set(got))})
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b"
                             % (len(answer), answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _read_to_the_end(reader: asyncio.StreamReader) -> int:
    count = 0
    try:
        while data := await reader.read(1 << 16):
            count += len(data)
    except ConnectionError:  # a reset ends it as well as a FIN does
        pass
    return count


@pytest.fixture
async def backends() -> AsyncIterator[list[SlowBackend]]:
    started: list[SlowBackend] = []
    yield started
    for backend in started:
        await backend.stop()


def large_body(size: int) -> bytes:
    return bytes(range(256)) * (size // 256)


async def test_a_large_body_read_slowly_is_sent_whole_before_first_byte_s_starts(
        backends: list[SlowBackend]) -> None:
    # Reading the first half takes ~0.5 s (32 pauses): longer than first_byte_s, which
    # must not run while the backend is still taking the request in.
    backend = SlowBackend(["slow"])
    backends.append(backend)
    body = large_body(16 * MIB)
    client = Http1Client(await backend.start(), max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=0.25, total_s=10.0))
    response = await client.post("/x", body)
    assert response.status == 200
    assert orjson.loads(await response.read()) == {"length": len(body), "values": 256}
    response.release()
    small = await client.post("/x", b"{}")  # the connection is kept for the next request
    assert orjson.loads(await small.read()) == {"length": 2, "values": 2}
    small.release()
    assert backend.connections == 1
    await client.close()


async def test_a_backend_that_never_reads_the_body_is_cut_by_total_s_and_dropped(
        backends: list[SlowBackend]) -> None:
    backend = SlowBackend(["stall", "slow"])
    backends.append(backend)
    body = large_body(32 * MIB)  # far more than the kernel buffers on either side
    client = Http1Client(await backend.start(), max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=0.4))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match="Total timeout"):
        await client.post("/x", body)
    assert loop.time() - started < 1.5
    # Aborted, not closed: what the transport still buffered is discarded, so the
    # backend, once it reads, gets a part of the body and then the end of the connection.
    backend.release.set()
    got = await asyncio.wait_for(backend.stalled_got, 5.0)
    assert got < 16 * MIB  # (of 32)
    # The only slot is free again, and the next request goes on a new connection.
    response = await client.post("/x", b"{}")
    assert orjson.loads(await response.read()) == {"length": 2, "values": 2}
    response.release()
    assert backend.connections == 2
    await client.close()


async def test_a_body_at_the_threshold_is_written_in_one_piece_and_arrives_whole(
        backends: list[SlowBackend]) -> None:
    backend = SlowBackend(["slow"], pause_s=0.0)
    backends.append(backend)
    client = Http1Client(await backend.start(), max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=10.0))
    for size in (LARGE_BODY_BYTES, LARGE_BODY_BYTES + 256):
        response = await client.post("/x", large_body(size))
        assert orjson.loads(await response.read()) == {"length": size, "values": 256}
        response.release()
    assert backend.connections == 1
    await client.close()


async def test_a_request_cancelled_while_its_body_is_written_drops_the_connection(
        backends: list[SlowBackend]) -> None:
    # A client that goes away while the gateway writes its large body to a backend that
    # does not read: the connection is aborted and the slot is free at once.
    backend = SlowBackend(["stall", "slow"])
    backends.append(backend)
    client = Http1Client(await backend.start(), max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=10.0))
    sending = asyncio.ensure_future(client.post("/x", large_body(32 * MIB)))
    await asyncio.sleep(0.1)
    assert not sending.done()  # held by flow control, not written into memory and left
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    backend.release.set()
    assert await asyncio.wait_for(backend.stalled_got, 5.0) < 16 * MIB
    response = await client.post("/x", b"{}")
    assert orjson.loads(await response.read()) == {"length": 2, "values": 2}
    response.release()
    await client.close()


async def test_a_backend_that_answers_before_reading_the_body_is_heard_at_once(
        backends: list[SlowBackend]) -> None:
    # A 413 on a connection the backend keeps open: its answer is the response, not a
    # wait for `total_s` on a body nobody reads; the connection is not used again.
    backend = SlowBackend(["early", "slow"])
    backends.append(backend)
    client = Http1Client(await backend.start(), max_connections=1,
                         timeouts=Timeouts(connect_s=2.0, first_byte_s=30.0, total_s=60.0))
    response = await asyncio.wait_for(client.post("/x", large_body(32 * MIB)), 10.0)
    assert response.status == 413
    assert orjson.loads(await response.read()) == {"error": {"message": "too large"}}
    response.release()
    backend.release.set()
    response = await client.post("/x", b"{}")  # on a new connection
    assert orjson.loads(await response.read()) == {"length": 2, "values": 2}
    response.release()
    assert backend.connections == 2
    await client.close()
