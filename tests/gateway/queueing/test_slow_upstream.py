"""The queue in front of a real (slow, loopback) upstream that counts what reaches it."""

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.queueing import BackendQueues

SERVICE_S = 0.02


class SlowUpstream:
    def __init__(self) -> None:
        self.busy = 0
        self.peak = 0
        self.received: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body["id"])
        self.busy += 1
        self.peak = max(self.peak, self.busy)
        try:
            await asyncio.sleep(SERVICE_S)
        finally:
            self.busy -= 1
        return web.json_response({"id": body["id"], "object": "chat.completion"})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[SlowUpstream, str]]:
    fake = SlowUpstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}/v1/chat/completions"
    await runner.cleanup()


async def call(queues: BackendQueues, session: aiohttp.ClientSession, url: str,
               request_id: str) -> float:
    async with queues.acquire("local", tenant="acme") as ticket:
        timeout = aiohttp.ClientTimeout(total=5)
        async with session.post(url, json={"id": request_id}, timeout=timeout) as response:
            await response.read()
        return ticket.waited_s


async def test_upstream_never_sees_more_than_the_limit(
        upstream: tuple[SlowUpstream, str]) -> None:
    fake, url = upstream
    queues = BackendQueues()
    queues.set_limit("local", 2)
    async with aiohttp.ClientSession() as session:
        waits = await asyncio.gather(*(call(queues, session, url, f"r{i}") for i in range(12)))
    assert fake.peak == 2
    assert len(fake.received) == 12
    assert max(waits) >= 4 * SERVICE_S  # the last pair waited for five pairs ahead of it
    assert queues.snapshot("local").in_flight == 0


async def test_client_that_disconnects_while_queued_never_reaches_the_upstream(
        upstream: tuple[SlowUpstream, str]) -> None:
    fake, url = upstream
    queues = BackendQueues()
    queues.set_limit("local", 1)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(call(queues, session, url, "first"))
        await asyncio.sleep(0.005)
        gone = asyncio.create_task(call(queues, session, url, "gone"))
        last = asyncio.create_task(call(queues, session, url, "last"))
        await asyncio.sleep(0.005)
        assert queues.snapshot("local").waiting == 2
        gone.cancel()  # what aiohttp does to a handler whose client went away
        await asyncio.sleep(0)
        assert queues.snapshot("local").waiting == 1
        await asyncio.gather(first, last)
    assert fake.received == ["first", "last"]
    assert queues.snapshot("local").in_flight == 0
