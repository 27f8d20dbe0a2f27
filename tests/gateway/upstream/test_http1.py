"""The backend client: kept-alive, bounded connections; aiohttp's parser and errors;
every timeout the policy names."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.core.deadline import Timeouts
from gateway.upstream.http1 import Http1Client
from gateway.upstream.http1_errors import ConnectFailed

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RELAXED = Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=10.0)


class Server:
    """A real aiohttp server that records each request's headers and the peer port of
    the connection it came on."""

    def __init__(self) -> None:
        self.peers: list[int] = []
        self.headers: list[CIMultiDict[str]] = []
        self.paths: list[str] = []
        self.open_now = 0
        self.most_open = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    def track(self, handler: Handler) -> Handler:
        async def tracked(request: web.Request) -> web.StreamResponse:
            self.peers.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
            self.headers.append(request.headers.copy())
            self.paths.append(request.path)
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
            try:
                return await handler(request)
            finally:
                self.open_now -= 1
        return tracked

    async def start(self, handler: Handler, **server_kwargs: object) -> str:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.track(handler))
        self.runner = web.AppRunner(app, **server_kwargs)  # type: ignore[arg-type]
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    running = Server()
    yield running
    if running.runner is not None:
        await running.runner.cleanup()


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"got": (await request.read()).decode()})


async def test_sequential_requests_reuse_one_connection(server: Server) -> None:
    client = Http1Client(await server.start(echo), max_connections=4, timeouts=RELAXED)
    for n in range(5):
        response = await client.post("/chat/completions", b'{"n": %d}' % n)
        assert response.status == 200 and response.content_type == "application/json"
        assert await response.read() == b'{"got": "{\\"n\\": %d}"}' % n
        response.release()
    assert len(set(server.peers)) == 1
    await client.close()


async def test_the_request_carries_base_path_host_length_and_extra_headers(
        server: Server) -> None:
    url = await server.start(echo)
    client = Http1Client(url, max_connections=1, timeouts=RELAXED,
                         headers={"Authorization": "Bearer sk-up"})
    response = await client.post("/embeddings", b"{}", {"X-Request-Id": "r1"})
    await response.read()
    response.release()
    sent = server.headers[0]
    assert server.paths == ["/v1/embeddings"]
    assert sent["Host"] == url.split("/")[2]
    assert sent["Content-Length"] == "2" and sent["Authorization"] == "Bearer sk-up"
    assert sent["X-Request-Id"] == "r1" and sent["User-Agent"].startswith("routegate")
    await client.close()


async def test_a_header_value_with_a_line_break_is_refused(server: Server) -> None:
    client = Http1Client(await server.start(echo), max_connections=1, timeouts=RELAXED)
    with pytest.raises(ValueError, match="line break"):
        await client.post("/x", b"{}", {"traceparent": "00-a\r\nX-Evil: 1"})
    assert server.peers == []
    await client.close()


@pytest.mark.parametrize("url", ["http://user:s3cret@127.0.0.1:1/v1",
                                 "https://:s3cret@[::1]:1/v1"])
def test_a_url_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    # The policy refuses such a URL at load; the client never drops them silently.
    with pytest.raises(ValueError, match="credentials") as refused:
        Http1Client(url, max_connections=1, timeouts=RELAXED)
    assert "s3cret" not in str(refused.value)


async def test_connections_never_exceed_the_bound_and_waiters_are_served(
        server: Server) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.json_response({})

    client = Http1Client(await server.start(slow), max_connections=2, timeouts=RELAXED)

    async def one() -> int:
        response = await client.post("/x", b"{}")
        await response.read()
        response.release()
        return response.status

    assert await asyncio.gather(*(one() for _ in range(7))) == [200] * 7
    assert server.most_open == 2 and len(set(server.peers)) == 2
    await client.close()


async def test_a_cancelled_waiter_gives_its_turn_back(server: Server) -> None:
    client = Http1Client(await server.start(echo), max_connections=1, timeouts=RELAXED)
    held = await client.post("/x", b"{}")
    waiting = asyncio.ensure_future(client.post("/x", b"{}"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await held.read()
    held.release()
    response = await client.post("/x", b"{}")  # the one connection is free again
    assert response.status == 200
    response.release()
    await client.close()


async def test_a_waiter_cancelled_as_its_turn_comes_is_an_ordinary_cancellation(
        server: Server) -> None:
    # The waiter is cancelled (a timeout, a client gone) and, before its task runs
    # again, the held connection comes back and passes over the cancelled waiter.
    client = Http1Client(await server.start(echo), max_connections=1, timeouts=RELAXED)
    held = await client.post("/x", b"{}")
    await held.read()
    waiting = asyncio.ensure_future(client.post("/x", b"{}"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    held.release()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    response = await client.post("/x", b"{}")  # the one connection is free again
    assert response.status == 200
    response.release()
    await client.close()


async def test_the_wait_for_a_free_connection_has_its_own_bound(server: Server) -> None:
    client = Http1Client(await server.start(echo), max_connections=1,
                         timeouts=Timeouts(connect_s=1.0, first_byte_s=5.0, total_s=10.0,
                                           pool_wait_s=0.1))
    held = await client.post("/x", b"{}")
    with pytest.raises(TimeoutError, match="max_connections"):
        await asyncio.wait_for(client.post("/x", b"{}"), 1.0)
    held.close()
    await client.close()


async def test_chunked_and_gzip_bodies_are_decoded(server: Server) -> None:
    async def chunked_gzip(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Encoding": "gzip",
                                               "Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        packed = gzip.compress(b"data: one\n\ndata: two\n\n")
        for part in (packed[:10], packed[10:]):
            await response.write(part)
        await response.write_eof()
        return response

    client = Http1Client(await server.start(chunked_gzip), max_connections=1,
                         timeouts=RELAXED)
    response = await client.post("/x", b"{}")
    assert response.content_type == "text/event-stream"
    assert await response.read() == b"data: one\n\ndata: two\n\n"
    response.release()
    await client.close()


async def test_no_response_within_first_byte_timeout_fails_as_a_timeout(
        server: Server) -> None:
    async def silent(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    client = Http1Client(await server.start(silent), max_connections=1,
                         timeouts=Timeouts(connect_s=1.0, first_byte_s=0.2, total_s=10.0))
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await client.post("/x", b"{}")
    assert asyncio.get_running_loop().time() - started < 1.0
    await client.close()


async def test_a_stream_longer_than_the_total_timeout_is_cut(server: Server) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(50):
            await response.write(b"data: x\n\n")
            await asyncio.sleep(0.05)
        return response

    client = Http1Client(await server.start(trickle), max_connections=1,
                         timeouts=Timeouts(connect_s=1.0, first_byte_s=1.0, total_s=0.3))
    response = await client.post("/x", b"{}")
    got = b""
    with pytest.raises(TimeoutError):
        while data := await response.content.readany():
            got += data
    assert got.startswith(b"data: x\n\n")
    await client.close()


async def test_an_unreachable_backend_is_a_connect_failure() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = Http1Client(f"http://127.0.0.1:{port}", max_connections=1, timeouts=RELAXED)
    with pytest.raises(ConnectFailed) as failed:
        await client.post("/x", b"{}")
    assert isinstance(failed.value.os_error, ConnectionRefusedError)
    with pytest.raises(ConnectFailed):  # the failed attempt did not keep the only slot
        await client.post("/x", b"{}")
    await client.close()


async def test_closing_a_response_mid_stream_drops_its_connection(server: Server) -> None:
    gone = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(b"data: x\n\n")
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            gone.set()
            raise

    client = Http1Client(await server.start(endless, handler_cancellation=True),
                         max_connections=1, timeouts=RELAXED)
    response = await client.post("/x", b"{}")
    assert await response.content.readany()
    response.close()
    await asyncio.wait_for(gone.wait(), 2.0)
    await client.close()


async def test_a_connection_the_backend_closed_while_idle_is_not_reused(
        server: Server) -> None:
    async def once(request: web.Request) -> web.Response:
        return web.json_response({}, headers={"Connection": "close"})

    client = Http1Client(await server.start(once), max_connections=1, timeouts=RELAXED)
    for _ in range(3):
        response = await client.post("/x", b"{}")
        await response.read()
        response.release()
        assert response.status == 200
    assert len(set(server.peers)) == 3
    await client.close()


async def test_errors_mid_body_are_aiohttps_payload_errors(server: Server) -> None:
    async def truncated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100"})
        await response.prepare(request)
        await response.write(b"only part")
        assert request.transport is not None
        request.transport.close()
        return response

    client = Http1Client(await server.start(truncated), max_connections=1,
                         timeouts=RELAXED)
    response = await client.post("/x", b"{}")
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()
    response.close()
    await client.close()


async def test_a_body_with_no_length_is_read_to_the_end_of_the_connection() -> None:
    async def raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\": 1}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(raw, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Http1Client(f"http://127.0.0.1:{port}", max_connections=1, timeouts=RELAXED)
    response = await client.post("/x", b"{}")
    assert await response.read() == b'{"a": 1}'
    response.release()
    await client.close()
    server.close()
    await server.wait_closed()


async def test_waiting_for_a_free_connection_counts_against_the_total_timeout(
        server: Server) -> None:
    client = Http1Client(await server.start(echo), max_connections=1, timeouts=RELAXED)
    held = await client.post("/x", b"{}")  # held throughout: its turn never comes
    with pytest.raises(TimeoutError):
        await client.post("/x", b"{}", timeouts=Timeouts(connect_s=1.0, first_byte_s=1.0,
                                                          total_s=0.2))
    held.close()
    response = await client.post("/x", b"{}")  # the timed-out waiter left no trace
    assert response.status == 200
    response.release()
    await client.close()


class RawBackend:
    """Answers a request per connection as told: "ok" (200, kept alive) or "drop"
    (reads the request, closes without a word: a backend's idle timeout racing it)."""

    def __init__(self, script: list[list[str]]) -> None:
        self.script = script  # per connection, in order: what to do with each request
        self.connections = 0
        self.requests = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        plan = self.script[self.connections]
        self.connections += 1
        for action in plan:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            self.requests += 1
            if action == "drop":
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        writer.close()

    async def start(self) -> tuple[asyncio.Server, str]:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_kept_alive_connection_closed_under_a_request_is_retried_once_anew() -> None:
    backend = RawBackend([["ok", "drop"], ["ok"]])
    server, url = await backend.start()
    client = Http1Client(url, max_connections=1, timeouts=RELAXED)
    for _ in range(2):
        response = await client.post("/x", b"{}")
        assert response.status == 200 and await response.read() == b"{}"
        response.release()
    assert backend.connections == 2 and backend.requests == 3
    await client.close()
    server.close()


async def test_a_new_connection_closed_without_an_answer_is_not_retried() -> None:
    backend = RawBackend([["drop"], ["ok"]])
    server, url = await backend.start()
    client = Http1Client(url, max_connections=1, timeouts=RELAXED)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.post("/x", b"{}")
    assert backend.connections == 1 and backend.requests == 1
    await client.close()
    server.close()
