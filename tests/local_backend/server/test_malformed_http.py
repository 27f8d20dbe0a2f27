"""Malformed HTTP gets an OpenAI-shaped error, and nothing of the request reaches the
log: a bearer token with a stray byte in it is neither echoed nor logged."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import openai
import pytest
from aiohttp import web

from local_backend.server.app import create_app
from local_backend.server.runner import BackendRunner, serve
from tests.local_backend.conftest import EngineFactory
from tests.malformed_http import MALFORMED, assert_refused_cleanly


@pytest.fixture
async def backend_port(make_engine: EngineFactory) -> AsyncIterator[int]:
    """The tiny model's app served by `BackendRunner` on a free loopback port."""
    app = create_app(make_engine(start=False), model_name="tiny")
    runner = BackendRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner.addresses[0][1]
    await runner.cleanup()


@pytest.mark.parametrize(("request_bytes", "status", "code"), MALFORMED)
async def test_malformed_http_gets_an_openai_error_and_the_log_keeps_none_of_it(
        backend_port: int, caplog: pytest.LogCaptureFixture, request_bytes: bytes,
        status: int, code: str) -> None:
    await assert_refused_cleanly("127.0.0.1", backend_port, request_bytes, status, code, caplog)
    # and the backend carries on
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{backend_port}/v1",
                                api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None
    await client.close()


async def test_serve_reports_an_address_in_use(
        backend_port: int, make_engine: EngineFactory,
        caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(make_engine(start=False), model_name="tiny")
    with caplog.at_level(logging.ERROR):
        assert await serve(app, "127.0.0.1", backend_port) == 1
    assert f"cannot listen on 127.0.0.1:{backend_port}" in caplog.text
