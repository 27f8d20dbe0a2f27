"""The dashboard as the on-call engineer reads it, in headless Chromium: health, load,
answers by status class, spend equal to the ledger's, time axes, nothing clipped."""

from __future__ import annotations

import html
import re
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.auth import key_hash
from gateway.telemetry.live import LiveWindow, Sample
from tests.conftest import StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.dashboard.chromium import chromium_or_skip, png_colours, run_chromium

ADMIN = "admin-key"
LONG = "shared-provider-with-a-rather-long-name"


def test_failed_requests_count_in_status_classes_not_in_latency() -> None:
    live = LiveWindow()
    now = live.clock()
    for i, (status, total) in enumerate([(200, 900.0), (200, 1100.0), (502, 2.0), (502, 3.0),
                                         (502, 1.0), (429, 1.0)]):
        live.record(Sample(at_s=now - i, backend="b", route="chat", status=status,
                           total_ms=total, queue_ms=0.0, ttft_ms=None, inference_ms=800.0,
                           reason="cheapest", cost_usd=0.0))
    backend = live.snapshot()["backends"]["b"]
    assert backend["status_classes"] == {"2xx": 2, "4xx": 1, "5xx": 3}
    assert backend["error_rate"] == 0.5
    assert backend["e2e_ms"] == {"p50": 900.0, "p95": 1100.0}  # the answers only
    assert backend["e2e_ms"]["p50"] >= backend["inference_ms"]["p50"]


def rows(dom: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', dom, re.S)
    assert body, table
    return [[html.unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)]


@pytest.mark.slow
async def test_on_call_view_matches_the_ledger_and_the_metrics_with_nothing_clipped(
    start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
) -> None:
    binary = chromium_or_skip()
    local = await start_upstream(name="local")
    shared = await start_upstream(name="shared")
    broken = await start_upstream(Behaviour(status=500), name="broken")
    policy = single_backend_policy(local.url, backend="local")
    policy["backends"][LONG] = {"type": "openai", "url": shared.url, "models": {"m": {
        "input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 2000.0}}}
    policy["backends"]["broken"] = {"type": "openai", "url": broken.url, "models": {"m": {}}}
    policy["routes"]["pricey"] = {"targets": [f"{LONG}/m"]}
    policy["routes"]["flaky"] = {"targets": ["broken/m"]}
    policy["auth"] = {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN)]}
    gateway = await start_gateway(policy)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as session:
        for model, times in (("chat", 4), ("pricey", 4), ("flaky", 2), ("missing", 1)):
            for _ in range(times):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(gateway.base_url + "/chat/completions",
                                        json=body) as response:
                    await response.read()
        async with session.get(gateway.url + "/admin/usage?tenant=anonymous",
                               headers=admin) as response:
            usage = await response.json()
        async with session.get(gateway.url + "/metrics", headers=admin) as response:
            metrics = await response.text()

    url = gateway.url + f"/dashboard#key={ADMIN}"
    dom = await run_chromium(binary, tmp_path / "p", "--window-size=900,1600", "--dump-dom", url)
    body = re.search(r"<body[^>]*>", dom)
    assert body and re.search(r'data-rendered="[1-9]', body.group(0)), dom[:500]
    assert 'data-overflowing="0"' in body.group(0), body.group(0)

    # what the page shows equals what the ledger and the metrics say
    spend = re.search(r'id="spend">\$([0-9.]+)<', dom)
    assert spend and usage["day"]["spend_usd"] > 0
    assert spend.group(1) == f"{usage['day']['spend_usd']:.4f}"
    requests: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "routegate_requests_total":
                key = (sample.labels["backend"], sample.labels["status"][0] + "xx")
                requests[key] = requests.get(key, 0) + sample.value
    table = {row[0]: row for row in rows(dom, "backends")}
    assert set(table) == {"local", LONG, "broken"}
    for name, row in table.items():
        state, in_flight, queued, total, ok, client, server = row[1:8]
        assert (state, in_flight, queued) == ("ready", "0", "0")
        assert int(total) == sum(v for (b, _), v in requests.items() if b == name)
        assert int(ok) == requests.get((name, "2xx"), 0)
        assert int(client) == requests.get((name, "4xx"), 0)
        assert int(server) == requests.get((name, "5xx"), 0)
    assert table["broken"][7:9] == ["2", "100.0%"] and table["local"][8] == "0.0%"
    version = re.search(r'routegate_policy_info\{[^}]*version="(\w+)"', metrics)
    assert version and f"policy {version.group(1)} · loaded" in dom, metrics[-800:]

    # every time axis is labelled; empty tables say so; no text is clipped
    axis = re.search(r'id="chart-rate"[^>]*data-time-axis="([^"]+)"', dom)
    assert axis and axis.group(1).startswith("−60 s") and axis.group(1).endswith("now")
    assert rows(dom, "rejections") == [["none"]]
    canvases = re.findall(r'<canvas id="(chart-[a-z0-9]+)"([^>]*)>', dom)
    assert len(canvases) == 4
    for name, attributes in canvases:
        assert 'data-clipped="0"' in attributes, (name, attributes)
    shortened = re.search(r'id="chart-e2e"[^>]*data-shortened="(\d+)"', dom)
    assert shortened and int(shortened.group(1)) > 0  # the long name fitted, not cut off

    shot = tmp_path / "dashboard.png"
    await run_chromium(binary, tmp_path / "p", "--window-size=900,1600",
                       f"--screenshot={shot}", url)
    width, height, distinct_rows = png_colours(shot)
    assert (width, height) == (900, 1600) and distinct_rows > 200
