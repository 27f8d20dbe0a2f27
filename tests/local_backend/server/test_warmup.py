"""Warm-up: the server listens only after real forwards at its serving shapes have run,
and reports the rates it measured at /health and on its model card (which the gateway
reads with `policies.capabilities.from_report`)."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from local_backend.server.app import create_app
from local_backend.server.runner import BackendRunner
from policies.capabilities import from_report
from tests.local_backend.conftest import EngineFactory


async def test_the_engine_has_run_before_the_server_listens_and_reports_its_rates(
        make_engine: EngineFactory) -> None:
    engine = make_engine(start=False, num_blocks=128, max_num_batched_tokens=64)
    runner = BackendRunner(create_app(engine, model_name="tiny", warm=True))
    await runner.setup()  # the app's start-up, warm-up included; nothing listens yet
    try:
        stats = engine.stats()
        # the warm-up's prompts: one of the full 64-token step budget beside a short
        # one, then the timed one (none shares a block with another)
        assert stats.prefix_cache_queries >= 64 + 16 + 32
        assert stats.prefix_cache_hits == 0
        assert stats.running == stats.waiting == 0
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.get("/health") as response:
                health: dict[str, Any] = await response.json()
            async with http.get("/v1/models") as response:
                card = (await response.json())["data"][0]
    finally:
        await runner.cleanup()
    assert health["status"] == "ok"
    assert health["prefill_tokens_per_s"] > 0 and health["decode_tokens_per_s"] > 0
    report = from_report(card)
    assert report is not None
    assert report.prefill_tokens_per_s == health["prefill_tokens_per_s"]
    assert report.decode_tokens_per_s == health["decode_tokens_per_s"]


async def test_without_warm_up_health_reports_no_rates(make_engine: EngineFactory,
                                                       aiohttp_client: Any) -> None:
    client = await aiohttp_client(create_app(make_engine(start=False), model_name="tiny"))
    async with client.get("/health") as response:
        assert await response.json() == {"status": "ok"}
