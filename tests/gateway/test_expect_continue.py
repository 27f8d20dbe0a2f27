"""`Expect: 100-continue`: a body within the limit is asked for; one announced over it is
refused with 413 in the API's own error shape before the client sends it."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import orjson
import pytest

from tests.conftest import RunningGateway, StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

LIMIT = 1000
CHAT = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})


async def exchange(gateway: RunningGateway, path: str, length: int,
                   body: bytes | None = None) -> tuple[bytes, bytes]:
    """Send the head with `Expect: 100-continue`; send `body` only if told to continue.
    (what came back first, the final response)."""
    url = urlsplit(gateway.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                     "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode())
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        if first.startswith(b"HTTP/1.1 100") and body is not None:
            writer.write(body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        else:
            head = first
        length_line = next(line for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:"))
        final = head + await reader.readexactly(int(length_line.split(b":")[1]))
        return first, final
    finally:
        writer.close()


@pytest.fixture
async def gateway(openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> RunningGateway:
    return await start_gateway(single_backend_policy(openai_upstream.url,
                                                     server={"max_body_bytes": LIMIT}))


async def test_a_body_within_the_limit_is_asked_for_and_served(
        gateway: RunningGateway) -> None:
    first, final = await exchange(gateway, "/v1/chat/completions", len(CHAT), CHAT)
    assert first.startswith(b"HTTP/1.1 100 Continue")
    assert final.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("path, shape", [("/v1/chat/completions", b'"error":{"message"'),
                                         ("/v1/messages", b'"type":"error"')])
async def test_a_body_announced_over_the_limit_is_refused_before_it_is_sent(
        gateway: RunningGateway, openai_upstream: FakeOpenAI, path: str, shape: bytes) -> None:
    first, final = await exchange(gateway, path, 10 * LIMIT)  # the body is never sent
    assert first.startswith(b"HTTP/1.1 413")
    assert shape in final and b"Server-Timing" in final
    assert openai_upstream.received == []
