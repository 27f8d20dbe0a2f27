"""Dedicated backends' own load, read from their Prometheus /metrics, reaches routing."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from gateway.core.live_policy import LivePolicy
from gateway.route.load import BackendLoadPoller, metrics_url, parse_load
from gateway.upstream.pool import UpstreamPool
from routing.stats import LiveStats
from tests.conftest import as_policy
from tests.fakes.openai_upstream import FakeOpenAI

METRICS = """# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 7.0
vllm:num_requests_waiting{model_name="llama"} 3.0
vllm:kv_cache_usage_perc{model_name="llama"} 0.42
vllm:num_requests_waiting{model_name="other"} 2.0
"""


def test_prometheus_text_is_summed_over_models() -> None:
    assert parse_load(METRICS) == (5, 7, 0.42)
    assert parse_load("vllm:gpu_cache_usage_perc 0.9\n") == (None, None, 0.9)
    assert parse_load("other_metric 1\n") == (None, None, None)


def test_the_metrics_page_sits_beside_the_v1_api() -> None:
    assert metrics_url("http://127.0.0.1:8001/v1") == "http://127.0.0.1:8001/metrics"


async def test_a_dedicated_backends_reported_load_feeds_the_stats() -> None:
    backend = FakeOpenAI(name="local")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    backend.app.router.add_get("/metrics", metrics)
    url = await backend.start()
    silent = FakeOpenAI(name="silent")  # no /metrics: 404, nothing reported
    silent_url = await silent.start()
    policy = as_policy({
        "version": 1,
        "backends": {
            "local": {"type": "openai", "url": url, "deployment": "dedicated",
                      "models": {"llama": {}}},
            "quiet": {"type": "openai", "url": silent_url, "deployment": "dedicated",
                      "models": {"m": {}}},
            "api": {"type": "openai", "url": url, "models": {"gpt": {}}},
        },
    })
    stats, pool = LiveStats(), UpstreamPool()
    try:
        async with aiohttp.ClientSession() as session:
            await BackendLoadPoller(LivePolicy(policy), pool, stats).poll_once(session)
    finally:
        await pool.close()
        await backend.stop()
        await silent.stop()
    snapshot = stats.snapshot()
    local = snapshot.target("local/llama")
    assert (local.backend_waiting, local.backend_running, local.kv_cache_use) == (5, 7, 0.42)
    assert local.load_at is not None
    assert snapshot.target("quiet/m").load_at is None
    assert snapshot.target("api/gpt").load_at is None  # shared APIs are not polled
