"""Routing in the running gateway: real app, fake OpenAI upstreams on loopback."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import aiohttp
from multidict import CIMultiDict

from gateway.app import HOOKS
from gateway.route.hook import ROUTING
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

EU_KEY = "eu-tenant-key"
MESSAGES = [{"role": "user", "content": "hello"}]


def policy(local: str, shared: str, *, pii_action: str = "local_only",
           on_miss: str = "fastest", local_concurrency: int = 8) -> dict[str, Any]:
    """A cheap dedicated EU backend and a pricier shared US API behind route `chat`."""
    return {
        "version": 1,
        "backends": {
            "local": {"type": "openai", "url": local, "deployment": "dedicated",
                      "region": "eu-west-1", "gpu_hour_usd": 0.1,
                      "max_concurrency": local_concurrency,
                      "models": {"llama": {"priors": {"network_ms": 1, "decode_tokens_per_s": 10,
                                                      "prefill_tokens_per_s": 5000}}}},
            "shared": {"type": "openai", "url": shared, "deployment": "shared", "region": "us",
                       "models": {"gpt": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 4,
                                          "priors": {"network_ms": 50,
                                                     "decode_tokens_per_s": 200}}}},
        },
        "routes": {"chat": {"targets": ["local/llama", "shared/gpt"],
                            "latency_budget": {"ttft_ms": 2000},
                            "on_budget_miss": on_miss}},
        "compliance": {
            "pii": {"detect": ["email", "us_ssn"], "action": pii_action},
            "rules": [{"name": "eu-stays-in-eu", "when": {"tenant_tags": ["eu"]},
                       "require": {"regions": ["eu-*"]}}],
        },
        "tenants": {"eu-co": {"tags": ["eu"], "api_keys": [
            "sha256:" + hashlib.sha256(EU_KEY.encode()).hexdigest()]}},
        "auth": {"anonymous": {"enabled": True}},
    }


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
               ) -> tuple[int, CIMultiDict[str], Any]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body, headers=headers or {}) as response:
        payload = await response.read()
        try:
            data: Any = await response.json(content_type=None)
        except ValueError:
            data = payload
        return response.status, CIMultiDict(response.headers), data


async def two(start_upstream: StartUpstream) -> tuple[FakeOpenAI, FakeOpenAI]:
    return await start_upstream(name="local"), await start_upstream(name="shared")


async def test_the_cheapest_target_serves_and_the_response_names_route_and_decision(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url))
    status, headers, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES})
    assert status == 200 and len(local.received) == 1 and not shared.received
    assert headers["x-routegate-route"] == "local/llama"
    assert headers["x-routegate-decision"] == headers["X-Request-Id"]


async def test_a_failing_primary_falls_back_and_the_header_names_who_answered(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(status=503), name="local")
    shared = await start_upstream(name="shared")
    gateway = await start_gateway(policy(local.url, shared.url))
    status, headers, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES})
    assert status == 200 and len(local.received) == 1 and len(shared.received) == 1
    assert headers["x-routegate-route"] == "shared/gpt"
    snapshot = gateway.app[ROUTING].stats.snapshot()
    assert snapshot.target("local/llama").error_rate > 0
    assert snapshot.target("shared/gpt").samples == 1


async def test_when_every_candidate_fails_the_error_names_the_last_one_tried(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(status=503), name="local")
    shared = await start_upstream(Behaviour(status=503), name="shared")
    gateway = await start_gateway(policy(local.url, shared.url))
    status, headers, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES})
    assert status == 502 and len(local.received) == 1 and len(shared.received) == 1
    assert headers["x-routegate-route"] == "shared/gpt"
    assert headers["x-routegate-decision"] == headers["X-Request-Id"]


async def test_a_stream_names_its_route_and_decision_in_its_headers(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url))
    status, headers, _ = await post(
        gateway.url, {"model": "chat", "messages": MESSAGES, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["x-routegate-route"] == "local/llama"
    assert headers["x-routegate-decision"] == headers["X-Request-Id"]


async def test_redaction_applies_to_the_bytes_the_upstream_receives(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url, pii_action="redact"))
    body = {"model": "chat", "messages": [
        {"role": "user", "content": "mail jane@corp.example, ssn 123-45-6789"}]}
    status, _, _ = await post(gateway.url, body)
    assert status == 200
    raw = local.received[0].raw
    assert b"jane@corp.example" not in raw and b"123-45-6789" not in raw
    assert local.received[0].json["messages"][0]["content"] == "mail [EMAIL], ssn [US_SSN]"
    assert local.received[0].json["model"] == "llama"


async def test_pii_block_is_a_403_naming_the_category_but_never_the_text(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url, pii_action="block"))
    body = {"model": "chat", "messages": [{"role": "user", "content": "ssn 123-45-6789"}]}
    status, headers, data = await post(gateway.url, body)
    assert status == 403 and data["error"]["code"] == "pii_blocked"
    assert "us_ssn" in data["error"]["message"]
    assert "123-45-6789" not in str(data) and "x-routegate-decision" in headers
    assert not local.received and not shared.received


async def test_pii_under_local_only_never_reaches_the_shared_api(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(status=500), name="local")
    shared = await start_upstream(name="shared")
    gateway = await start_gateway(policy(local.url, shared.url))
    body = {"model": "chat",
            "messages": [{"role": "user", "content": "I am jane@corp.example"}]}
    status, _, _ = await post(gateway.url, body)
    assert status == 502  # the only allowed backend failed; no fallback to shared
    assert len(local.received) == 1 and not shared.received


async def test_a_tenant_tagged_eu_is_served_in_the_eu_only(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(status=429), name="local")
    shared = await start_upstream(name="shared")
    gateway = await start_gateway(policy(local.url, shared.url))
    status, _, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES},
                              {"Authorization": f"Bearer {EU_KEY}"})
    assert status == 429 and not shared.received


async def test_nothing_within_budget_with_reject_is_a_503_naming_why(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url, on_miss="reject"))
    status, _, data = await post(gateway.url, {"model": "chat", "messages": MESSAGES},
                                 {"x-routegate-ttft-budget-ms": "0.5"})
    assert status == 503 and data["error"]["code"] == "latency_budget_unmeetable"
    assert "latency_budget" in data["error"]["message"] and not local.received


async def test_a_malformed_budget_header_is_a_400_naming_it(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url))
    status, _, data = await post(gateway.url, {"model": "chat", "messages": MESSAGES},
                                 {"x-routegate-total-budget-ms": "soon"})
    assert status == 400 and data["error"]["param"] == "x-routegate-total-budget-ms"


async def test_stats_learn_from_a_streamed_request(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    local.behaviour.chunk_delay_s = 0.01
    gateway = await start_gateway(policy(local.url, shared.url))
    status, _, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES,
                                            "stream": True})
    assert status == 200
    snap = gateway.app[ROUTING].stats.snapshot()
    target = snap.target("local/llama")
    assert target.samples == 1 and target.in_flight == 0
    assert target.ttft_ms is not None and target.decode_tokens_per_s is not None
    assert target.abs_ttft_error_ms is not None  # prediction compared with what happened
    assert snap.output_tokens_mean["chat"] > 0


async def test_prediction_error_is_exported_as_a_metric(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    gateway = await start_gateway(policy(local.url, shared.url))
    for stream in (True, False):
        status, _, _ = await post(gateway.url, {"model": "chat", "messages": MESSAGES,
                                                "stream": stream})
        assert status == 200
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as r:
        exposition = await r.text()
    name = "routegate_routing_prediction_error_seconds_count"
    assert f'{name}{{backend="local",kind="total",model="llama"}} 2.0' in exposition
    assert f'{name}{{backend="local",kind="ttft",model="llama"}} 1.0' in exposition  # stream


async def test_a_busy_local_backend_spills_to_the_shared_api_and_traffic_returns(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local, shared = await two(start_upstream)
    local.behaviour.pause_after_chunk = 1  # the first stream holds the only local slot
    gateway = await start_gateway(policy(local.url, shared.url, local_concurrency=1))
    assert gateway.app[HOOKS].router is gateway.app[ROUTING]
    body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": 50}
    holding = asyncio.create_task(post(gateway.url, body))
    await local.request_seen.wait()
    # 1 slot busy, a 50-token request at 10 tok/s ahead: ~5 s wait > the 2 s budget.
    status, headers, _ = await post(gateway.url, body)
    assert status == 200 and headers["x-routegate-route"] == "shared/gpt"
    local.resume.set()
    assert (await holding)[0] == 200
    local.behaviour.pause_after_chunk = None
    status, headers, _ = await post(gateway.url, body)
    assert headers["x-routegate-route"] == "local/llama"
