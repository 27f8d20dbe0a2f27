"""The real gateway on loopback for a synchronous test: hypothesis draws its examples
in plain functions, so the server runs on an `asyncio.Runner` the test owns, and each
example drives it with `runner.run(...)`.

    with live_gateway() as (runner, gateway):
        status = runner.run(exchange(gateway.port, b"GET /healthz HTTP/1.1\\r\\n\\r\\n"))
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.app import create_app
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from tests.conftest import as_policy, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

CHAT_BODY = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
GOOD_REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (len(CHAT_BODY), CHAT_BODY))


@dataclass
class LiveGateway:
    app: web.Application
    port: int


@contextmanager
def live_gateway(**policy: Any) -> Iterator[tuple[asyncio.Runner, LiveGateway]]:
    """The app behind `GatewayRunner` in front of a fake OpenAI backend; `policy` adds
    sections to `single_backend_policy`'s."""
    with asyncio.Runner() as runner:
        upstream = FakeOpenAI(Behaviour())
        runner.run(upstream.start())
        app = create_app(as_policy(single_backend_policy(upstream.url, **policy)),
                         Settings(port=0))
        server = GatewayRunner(app, handler_cancellation=True, access_log=None)

        async def start() -> int:
            await server.setup()
            await web.TCPSite(server, "127.0.0.1", 0).start()
            return int(server.addresses[0][1])

        try:
            yield runner, LiveGateway(app, runner.run(start()))
        finally:
            runner.run(server.cleanup())
            runner.run(upstream.stop())


async def exchange(port: int, request: bytes, *, within_s: float = 5.0) -> bytes:
    """Send `request` on a new connection and read until the gateway closes it (send
    `Connection: close`): every byte it answered. TimeoutError when it does not close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(within_s):
            return await reader.read()
    finally:
        writer.close()


def statuses(answer: bytes) -> list[int]:
    """The status of every response in `answer`, in order."""
    found = []
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            found.append(int(line[9:12]))
    return found
