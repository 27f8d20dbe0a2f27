"""`WholeResponse` puts on the wire exactly what `web.Response` would, in one write."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.core.whole_response import WholeResponse

BODY = b'{"id":"chatcmpl-1","object":"chat.completion"}'
_DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")


def _response(kind: str, status: int, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
    if kind == "aiohttp":
        return web.Response(status=status, body=body, headers=headers)
    return WholeResponse(status=status, body=body, headers=headers)


async def _handler(request: web.Request) -> web.StreamResponse:
    case = request.match_info["case"]
    kind = request.query["kind"]
    headers = {"Content-Type": "application/json", "X-Request-Id": "abc"}
    if case == "plain":
        return _response(kind, 200, BODY, headers)
    if case == "no-type":
        return _response(kind, 200, BODY, {"X-Request-Id": "abc"})
    if case == "empty":
        return _response(kind, 200, b"", headers)
    if case == "error":
        return _response(kind, 429, BODY, {**headers, "Retry-After": "3"})
    if case == "no-content":
        return _response(kind, 204, b"", headers)
    if case == "not-modified":
        return _response(kind, 304, b"", headers)
    if case == "force-close":
        response = _response(kind, 200, BODY, headers)
        response.force_close()
        return response
    if case == "length-given":
        return _response(kind, 200, BODY, {**headers, "Content-Length": str(len(BODY))})
    if case == "cookie":
        response = _response(kind, 200, BODY, headers)
        response.set_cookie("session", "s1")
        return response
    if case == "header-injection":
        return _response(kind, 200, BODY, {"X-Evil": "a\r\nSet-Cookie: x=1"})
    raise web.HTTPNotFound()


async def _add_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["X-Prepared"] = "yes"


@pytest.fixture
async def server() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_route("*", "/{case}", _handler)
    app.on_response_prepare.append(_add_header)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


async def _exchange(port: int, request: bytes, *, replies: int = 1) -> bytes:
    """The bytes of `replies` responses to `request`, each read to its end as HTTP/1.1
    frames it (its Content-Length, none for HEAD, 204 and 304, else the close)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    received = b""
    try:
        for _ in range(replies):
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            except asyncio.IncompleteReadError as closed:  # refused before any reply
                received += closed.partial
                break
            received += head
            length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
            if request.startswith(b"HEAD ") or head[9:12] in (b"204", b"304"):
                continue
            if length is not None:
                received += await reader.readexactly(int(length.group(1)))
            else:
                received += await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return _DATE.sub(b"\r\nDate: *\r\n", received)


def _request(case: str, kind: str, *, method: str = "GET", version: str = "1.1",
             extra: str = "") -> bytes:
    return (f"{method} /{case}?kind={kind} HTTP/{version}\r\nHost: gateway\r\n{extra}"
            "\r\n").encode()


CASES = ["plain", "no-type", "empty", "error", "no-content", "not-modified", "force-close",
         "length-given", "cookie"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("method", "version", "extra"), [
    ("GET", "1.1", ""),
    ("POST", "1.1", "Content-Length: 0\r\n"),
    ("GET", "1.1", "Connection: close\r\n"),
    ("HEAD", "1.1", ""),
    ("GET", "1.0", ""),
    ("GET", "1.0", "Connection: keep-alive\r\n"),
], ids=["get", "post", "close", "head", "http10", "http10-keep-alive"])
async def test_the_bytes_on_the_wire_are_those_of_web_response(
        server: int, case: str, method: str, version: str, extra: str) -> None:
    ours = await _exchange(server, _request(case, "whole", method=method, version=version,
                                            extra=extra))
    theirs = await _exchange(server, _request(case, "aiohttp", method=method, version=version,
                                              extra=extra))
    assert ours.startswith(b"HTTP/1.")
    assert ours == theirs


async def test_a_kept_alive_connection_serves_the_next_request(server: int) -> None:
    one = _request("plain", "whole")
    received = await _exchange(server, one + one, replies=2)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert received.count(BODY) == 2


async def test_a_header_value_with_a_line_break_is_never_sent(server: int) -> None:
    ours = await _exchange(server, _request("header-injection", "whole"))
    theirs = await _exchange(server, _request("header-injection", "aiohttp"))
    assert b"Set-Cookie: x=1" not in ours
    assert ours == theirs


async def test_the_fast_path_writes_once() -> None:
    """Status line, headers and body leave in one transport write."""
    writes: list[bytes] = []

    class Transport(asyncio.Transport):
        def write(self, data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            pass

    app = web.Application()
    app.router.add_get("/{case}", _handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    assert runner.server is not None
    protocol = runner.server()
    protocol.connection_made(Transport())
    protocol.data_received(b"GET /plain?kind=whole HTTP/1.1\r\nHost: g\r\n\r\n")
    for _ in range(20):
        if writes:
            break
        await asyncio.sleep(0.01)
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(BODY)
    protocol.connection_lost(None)
    await runner.cleanup()
