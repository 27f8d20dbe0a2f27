"""The gateway's own deadline is not the backend's failure, and ejection never leaves a
tenant nothing it may use: the cold-start scenario of a slow local backend that is an EU
tenant's only compliant target."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

import aiohttp

from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour

ADMIN_KEY = "admin-key-for-tests"
EU_KEY, US_KEY = "k-eu-tenant", "k-us-tenant"
QUICK = {"network_ms": 10, "prefill_tokens_per_s": 1_000_000, "decode_tokens_per_s": 1000}
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 50}


def policy(local: str, paid: str, *, rpm: int = 100, tpm: int = 100_000,
           ttft_ms: int = 300) -> dict[str, Any]:
    def backend(url: str, region: str, price: float) -> dict[str, Any]:
        return {"type": "openai", "url": url, "region": region, "models": {"m": {
            "input_usd_per_mtok": price, "output_usd_per_mtok": price, "priors": QUICK}}}

    def tenant(key: str, tags: list[str]) -> dict[str, Any]:
        return {"api_keys": ["sha256:" + hashlib.sha256(key.encode()).hexdigest()],
                "tags": tags,
                "limits": {"requests_per_minute": rpm, "tokens_per_minute": tpm}}

    return {"version": 1,
            "backends": {"local": backend(local, "eu-west-1", 0.0),
                         "paid": backend(paid, "us", 1.0)},
            "routes": {"chat": {"targets": ["local/m", "paid/m"],
                                "latency_budget": {"ttft_ms": ttft_ms}}},
            "compliance": {"rules": [{"name": "eu-stays-in-eu", "when": {"tenant_tags": ["eu"]},
                                      "require": {"regions": ["eu-*"]}}]},
            "resilience": {"outlier_detection": {"consecutive_failures": 2,
                                                 "base_ejection_s": 30}},
            "tenants": {"eu": tenant(EU_KEY, ["eu"]), "us": tenant(US_KEY, [])},
            "auth": {"admin_keys": [key_hash(ADMIN_KEY)]}}


async def post(gateway: RunningGateway, key: str) -> tuple[int, Any, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/chat/completions", json=BODY,
            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, await response.json(), dict(response.headers)


async def target(gateway: RunningGateway, key: str = "local/m") -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/backends",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        backends = (await response.json())["backends"]
    return backends[key.split("/")[0]]["targets"][key]


async def test_requests_cut_off_by_the_gateways_deadline_do_not_eject_the_backend(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=1.0), name="local")
    paid = await start_upstream(name="paid")
    gateway = await start_gateway(policy(local.url, paid.url))

    # a cold engine: concurrent requests all outlast the 300 ms budget
    replies = await asyncio.gather(*(post(gateway, EU_KEY) for _ in range(5)))
    assert [(status, body["error"]["code"]) for status, body, _ in replies] == \
        [(504, "deadline_exceeded")] * 5

    state = await target(gateway)
    assert state["state"] == "in_service" and state["consecutive_failures"] == 0
    assert state["error_rate"] == 0
    local.behaviour = Behaviour()  # warm now: the EU tenant is served at once
    status, _, headers = await post(gateway, EU_KEY)
    assert status == 200 and headers["x-routegate-route"] == "local/m"


async def test_a_tenants_last_compliant_target_keeps_serving_it_while_ejected(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(status=503, fail_times=2), name="local")
    paid = await start_upstream(name="paid")
    gateway = await start_gateway(policy(local.url, paid.url, ttft_ms=5000))

    # the US tenant's two requests fail on local/m and fall back: it is ejected
    for _ in range(2):
        status, _, headers = await post(gateway, US_KEY)
        assert status == 200 and headers["x-routegate-route"] == "paid/m"
    status, _, headers = await post(gateway, US_KEY)
    assert headers["x-routegate-route"] == "paid/m" and len(local.received) == 2

    state = await target(gateway)
    assert state["state"] == "degraded" and state["degraded_for"] == ["eu on chat"]
    # out for the US tenant, still the EU tenant's: it answers again, so the EU is served
    status, _, headers = await post(gateway, EU_KEY)
    assert status == 200 and headers["x-routegate-route"] == "local/m"


async def test_requests_no_backend_answered_leave_the_rate_limits_untouched(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=1.0), name="local")
    paid = await start_upstream(name="paid")
    limited = policy(local.url, paid.url, rpm=3, tpm=1000)
    limited["resilience"]["outlier_detection"]["enabled"] = False  # the limits alone
    gateway = await start_gateway(limited)

    for _ in range(3):  # the gateway's deadline runs out on each: refunded
        status, _, _ = await post(gateway, EU_KEY)
        assert status == 504
    local.behaviour = Behaviour(status=503)
    for _ in range(2):  # a 502 from the backend: no backend answered either
        status, _, _ = await post(gateway, EU_KEY)
        assert status == 502
    local.behaviour = Behaviour()
    status, _, headers = await post(gateway, EU_KEY)
    assert status == 200
    # RPM: this one only; TPM: this one's usage only
    assert headers["x-ratelimit-remaining-requests"] == "2"
    assert int(headers["x-ratelimit-remaining-tokens"]) > 1000 - 2 * 50


async def test_clients_that_go_away_do_not_eject_the_backend(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=1.0), name="local")
    paid = await start_upstream(name="paid")
    gateway = await start_gateway(policy(local.url, paid.url, ttft_ms=5000))

    for _ in range(3):  # more than `consecutive_failures`, each given up after 100 ms
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await post(gateway, EU_KEY)
    await asyncio.sleep(0.1)  # the gateway sees each disconnect and cancels upstream

    state = await target(gateway)
    assert state["state"] == "in_service" and state["consecutive_failures"] == 0
    assert len(local.received) == 3
