from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.core.auth import key_hash
from gateway.dashboard import dashboard_routes
from gateway.telemetry.live import LiveWindow, Sample
from tests.conftest import StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.dashboard.chromium import chromium_or_skip, png_colours, run_chromium


def traffic(live: LiveWindow) -> None:
    now = live.clock()
    for i in range(40):
        local = i % 4 != 0
        live.record(Sample(
            at_s=now - i * 0.5, backend="local" if local else "openai", route="chat",
            status=200 if i != 7 else 502, total_ms=120.0 + i * 3, queue_ms=4.0 + i % 5,
            ttft_ms=40.0 + i, inference_ms=(90.0 + i * 2) if local else None,
            reason="cheapest" if local else "fastest", cost_usd=0.0 if local else 0.0004,
        ))
    live.rejected("rate_limit")
    live.rejected("shed")


@pytest.fixture
async def dashboard() -> AsyncIterator[tuple[TestClient, LiveWindow]]:
    live = LiveWindow()
    app = web.Application()
    app.add_routes(dashboard_routes(live))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client, live


async def test_page_and_script_are_served_without_external_assets(
    dashboard: tuple[TestClient, LiveWindow],
) -> None:
    client, _ = dashboard
    page = await client.get("/dashboard")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    script = await (await client.get("/dashboard/dashboard.js")).text()
    for text in (html, script):
        assert not re.search(r"""(src|href)=["']https?://""", text)
        assert "cdn" not in text.lower()
    assert 'src="dashboard/dashboard.js"' in html


async def test_data_endpoint_summarises_per_backend(
    dashboard: tuple[TestClient, LiveWindow],
) -> None:
    client, live = dashboard
    traffic(live)
    data = await (await client.get("/dashboard/data")).json()
    assert set(data["backends"]) == {"local", "openai"}
    assert data["backends"]["openai"]["inference_ms"] == {"p50": None, "p95": None}
    assert data["backends"]["local"]["inference_ms"]["p95"] is not None
    assert data["share"] == {"local": 30, "openai": 10}
    assert data["rejections"] == {"rate_limit": 1, "shed": 1}


async def test_requests_refused_before_routing_are_not_a_backend_without_a_name(
    start_upstream: StartUpstream, start_gateway: StartGateway,
) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(single_backend_policy(upstream.url))
    async with aiohttp.ClientSession() as session:
        for model in ("no-such-model", "chat"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gateway.base_url + "/chat/completions", json=body) as r:
                await r.read()
        async with session.get(gateway.url + "/dashboard/data") as response:
            data = await response.json()
    assert data["requests"] == 2 and data["status"] == {"404": 1, "200": 1}
    assert set(data["backends"]) == {"up"}  # the 404 was served by no backend
    assert data["backends"]["up"]["requests"] == 1


async def gateway_traffic(start_upstream: StartUpstream, start_gateway: StartGateway,
                          admin_key: str | None = None) -> str:
    """A gateway over two fake backends, after a few real requests; its base URL."""
    local = await start_upstream(Behaviour(chunk_delay_s=0.001), name="local")
    shared = await start_upstream(Behaviour(processing_ms=3), name="shared")
    policy = single_backend_policy(local.url, backend="local")
    policy["backends"]["shared"] = {"type": "openai", "url": shared.url,
                                    "models": {"gpt-4o-mini": {}}}
    policy["routes"]["fast"] = {"targets": ["shared/gpt-4o-mini"]}
    if admin_key is not None:
        policy["auth"] = {"anonymous": {"enabled": True}, "admin_keys": [key_hash(admin_key)]}
    gateway = await start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        for i in range(12):
            body = {"model": "chat" if i % 3 else "fast", "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(gateway.base_url + "/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
    return gateway.url


@pytest.mark.slow
async def test_page_renders_charts_with_data_in_headless_chromium(
    start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    binary = chromium_or_skip()
    url = await gateway_traffic(start_upstream, start_gateway) + "/dashboard"
    dom = await run_chromium(binary, tmp_path / "profile", "--dump-dom", url)
    rendered = re.search(r'<body data-rendered="(\d+)"', dom)
    assert rendered and int(rendered.group(1)) >= 1, dom[:500]
    for chart in ("chart-e2e", "chart-latency", "chart-rate", "chart-share"):
        points = re.search(rf'id="{chart}" data-points="(\d+)"', dom)
        assert points and int(points.group(1)) > 0, chart
    assert "12 requests" in dom
    assert "No inference time reported by: local, shared" in dom

    shot = tmp_path / "dashboard.png"
    await run_chromium(binary, tmp_path / "profile", f"--screenshot={shot}", url)
    width, height, distinct_rows = png_colours(shot)
    assert (width, height) == (1280, 1000)
    assert shot.stat().st_size > 20_000
    assert distinct_rows > 100  # text and charts, not a blank page


async def test_data_needs_an_admin_key_when_the_policy_lists_admin_keys(
    start_upstream: StartUpstream, start_gateway: StartGateway,
) -> None:
    upstream = await start_upstream()
    policy = single_backend_policy(upstream.url)
    policy["auth"] = {"anonymous": {"enabled": True}, "admin_keys": [key_hash("admin-key")]}
    gateway = await start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.url + "/dashboard") as page:
            assert page.status == 200  # the page itself holds no data
        async with session.get(gateway.url + "/dashboard/data") as anonymous:
            assert anonymous.status == 401
        async with session.get(gateway.url + "/dashboard/data",
                               headers={"Authorization": "Bearer admin-key"}) as admin:
            assert admin.status == 200
            assert "backends" in await admin.json()


@pytest.mark.slow
async def test_page_sends_the_admin_key_from_its_url_fragment(
    start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    binary = chromium_or_skip()
    base = await gateway_traffic(start_upstream, start_gateway, admin_key="admin-key")
    locked = await run_chromium(binary, tmp_path / "a", "--dump-dom", base + "/dashboard")
    assert "open this page as /dashboard#key=ADMIN_KEY" in locked
    dom = await run_chromium(binary, tmp_path / "b", "--dump-dom",
                             base + "/dashboard#key=admin-key")
    assert "12 requests" in dom
