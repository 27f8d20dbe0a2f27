from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing, tracing_from_env
from tests.conftest import RunningGateway, StartScripted, as_policy
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, start_http

ACCESS_LOGGER = "test.routegate.access"


@pytest.fixture
async def otlp_receiver() -> AsyncIterator[tuple[OtlpReceiver, str]]:
    """A real OTLP/HTTP receiver on loopback: (receiver, its base URL)."""
    receiver = OtlpReceiver()
    runner, url = await start_http(receiver)
    yield receiver, url
    await runner.cleanup()


@pytest.fixture
async def refusing_collector() -> AsyncIterator[str]:
    """An OTLP/HTTP endpoint that refuses every export (400: not retried)."""
    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=400, text="bad request")

    app = web.Application()
    app.router.add_post("/v1/traces", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    await runner.cleanup()


@dataclass
class Traced:
    gateway: RunningGateway
    telemetry: Telemetry
    tracing: Tracing | None

    async def flush(self) -> None:
        # The exporter blocks its thread on the receiver, which runs on this loop.
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.sink.force_flush)


StartTraced = Callable[..., Awaitable[Traced]]


@pytest.fixture
async def start_traced() -> AsyncIterator[StartTraced]:
    """`await start_traced(policy, otlp_url=None)`: the real app with its own telemetry
    (exporting over OTLP/HTTP to `otlp_url` when given; access log to ACCESS_LOGGER)."""
    runners: list[web.AppRunner] = []
    tracings: list[Tracing] = []

    async def start(policy: Any, otlp_url: str | None = None) -> Traced:
        tracing = None
        if otlp_url:
            tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url,
                                        "OTEL_BSP_SCHEDULE_DELAY": "50"})
            if tracing is not None:
                tracings.append(tracing)
        telemetry = Telemetry(tracing=tracing,
                              access_log=AccessLog(logging.getLogger(ACCESS_LOGGER)))
        app = create_app(as_policy(policy), Settings(port=0), telemetry=telemetry)
        runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return Traced(RunningGateway(app=app, url=f"http://127.0.0.1:{port}"), telemetry,
                      tracing)

    yield start
    for runner in runners:
        await runner.cleanup()
    for tracing in tracings:  # stops the exporter process (it flushes to the receiver)
        await asyncio.to_thread(tracing.sink.shutdown)


StartRaw = Callable[[web.Response], Awaitable[str]]


@pytest.fixture
def start_raw(scripted_upstream: StartScripted) -> StartRaw:
    """`await start_raw(response)`: a backend answering every chat request with
    `response`; its base URL."""
    async def start(response: web.Response) -> str:
        async def chat(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(status=response.status, body=response.body,
                                headers=response.headers)

        return await scripted_upstream(chat)

    return start
