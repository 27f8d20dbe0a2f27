"""Each batch line is a request record like any other: a root span and an access line,
both carrying the batch's id, the lowest band, the tenant and the backend it ran on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import orjson
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from tests.conftest import StartUpstream, as_policy
from tests.gateway.batches.conftest import batch_policy, chat_lines, jsonl, submit, until_final

ACCESS = "test.batches.access"


@pytest.fixture
async def traced_runners() -> AsyncIterator[list[web.AppRunner]]:
    runners: list[web.AppRunner] = []
    yield runners
    for runner in runners:
        await runner.cleanup()


async def test_every_line_is_a_traced_and_logged_request_with_the_batch_id(
        start_upstream: StartUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        traced_runners: list[web.AppRunner]) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    spans = InMemorySpanExporter()
    telemetry = Telemetry(tracing=Tracing.to_processors([SimpleSpanProcessor(spans)]),
                          access_log=AccessLog(logging.getLogger(ACCESS)))
    app = create_app(as_policy(batch_policy(local.url, cloud.url, tmp_path)), Settings(port=0),
                     telemetry=telemetry)
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
    traced_runners.append(runner)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
                                api_key="anonymous", max_retries=0)
    caplog.set_level(logging.INFO, ACCESS)

    batch = await until_final(client, (await submit(client, jsonl(chat_lines(3)))).id)
    await asyncio.sleep(0.1)  # the last line's record is finished as its answer is kept

    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS]
    of_batch = [line for line in lines if line.get("batch_id") == batch.id]
    assert len(of_batch) == 3
    assert {line["backend"] for line in of_batch} == {"local"}
    assert all(line["status"] == 200 and line["tenant"] == "anonymous" for line in of_batch)
    roots = [s for s in spans.get_finished_spans()
             if (s.attributes or {}).get("routegate.batch.id") == batch.id]
    assert len(roots) == 3 and all(s.name == "POST /v1/chat/completions" for s in roots)
