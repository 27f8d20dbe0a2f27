"""A request sent on an idle kept-alive connection once the drain has closed the
listener is not left unanswered until the drain ends: the connection is closed at
once (the client retries elsewhere), while a stream in flight still finishes."""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from gateway.app import create_app
from gateway.core.drain import DRAIN, drain_and_stop
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from tests.conftest import StartUpstream, as_policy, single_backend_policy
from tests.fakes.openai_upstream import Behaviour

STREAM = orjson.dumps({"model": "chat", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]})
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"


async def test_an_idle_connection_closes_when_the_listener_closes_and_a_stream_finishes(
        start_upstream: StartUpstream) -> None:
    upstream = await start_upstream(Behaviour(pause_after_chunk=1))
    app = create_app(as_policy(single_backend_policy(upstream.url)), Settings(port=0))
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_writer.write(HEALTH)
        await asyncio.wait_for(idle_reader.readuntil(b'{"status":"ok"}'), 5.0)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                          % (len(STREAM), STREAM))
        await asyncio.wait_for(upstream.request_seen.wait(), 5.0)
        await asyncio.sleep(0.2)  # the stream's first event is on its way

        drained = asyncio.create_task(drain_and_stop(
            runner, app[DRAIN], announce_s=0.1, timeout_s=10.0, hurry=asyncio.Event()))
        await asyncio.sleep(0.5)  # past the announce: the listener is closed
        idle_writer.write(HEALTH)
        started = time.monotonic()
        answer = await asyncio.wait_for(idle_reader.read(), 5.0)  # until it closes
        waited_s = time.monotonic() - started

        assert answer == b"" or answer.startswith(b"HTTP/1.1 503 ")
        assert waited_s < 1.0
        assert not drained.done()  # the stream still runs
        upstream.resume.set()
        streamed = await asyncio.wait_for(busy_reader.read(), 10.0)
        assert b"data: [DONE]" in streamed
        await asyncio.wait_for(drained, 10.0)
        idle_writer.close()
        busy_writer.close()
    finally:
        await runner.cleanup()
