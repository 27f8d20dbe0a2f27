"""`GET /metrics` as an operator reads it: who may read it, labels, states, the policy."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import LIVE_POLICY
from gateway.settings import Settings
from policies import hash_key
from tests.conftest import StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

ADMIN_KEY = "rg-admin-metrics"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(
            url + "/metrics", headers=headers or {}) as response:
        return response.status, await response.text()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


async def test_metrics_auth_puts_metrics_behind_the_admin_key(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url, server={"metrics_auth": True},
                                   auth={"admin_keys": [hash_key(ADMIN_KEY)],
                                         "anonymous": {"enabled": True}})
    gateway = await start_gateway(policy)
    assert (await get(gateway.url))[0] == 401
    assert (await get(gateway.url, {"Authorization": "Bearer not-admin"}))[0] == 403
    status, text = await get(gateway.url, {"Authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200 and "routegate_requests_total" in text


async def test_metrics_are_open_by_default_when_the_policy_lists_no_admin_key(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url))
    assert (await get(gateway.url))[0] == 200


async def test_metrics_need_the_admin_key_by_default_once_the_policy_lists_one(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url,
                                   auth={"admin_keys": [hash_key(ADMIN_KEY)],
                                         "anonymous": {"enabled": True}})
    gateway = await start_gateway(policy)
    assert (await get(gateway.url))[0] == 401
    status, text = await get(gateway.url, {"Authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200 and "routegate_requests_total" in text


async def test_metrics_auth_false_opens_metrics_despite_admin_keys(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url, server={"metrics_auth": False},
                                   auth={"admin_keys": [hash_key(ADMIN_KEY)],
                                         "anonymous": {"enabled": True}})
    gateway = await start_gateway(policy)
    assert (await get(gateway.url))[0] == 200


async def test_requests_no_backend_took_leave_no_series_with_an_empty_label(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url, auth={"anonymous": {"enabled": False}})
    gateway = await start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        for body, headers in ((CHAT, {}), ({**CHAT, "model": "nope"}, {})):
            async with session.post(gateway.url + "/v1/chat/completions", json=body,
                                    headers=headers) as response:
                assert response.status == 401
    _, text = await get(gateway.url)
    assert '=""' not in text
    refused = samples(text, "routegate_requests_total")
    assert refused[(("backend", "none"), ("model", "none"), ("route", "none"),
                    ("status", "401"), ("tenant", "none"))] == 2
    assert not samples(text, "routegate_upstream_first_byte_seconds_count")


async def test_each_backend_state_and_the_running_policy_version_are_gauges(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy: dict[str, Any] = single_backend_policy(openai_upstream.url)
    policy["backends"]["off"] = {"type": "openai", "url": "http://127.0.0.1:1/v1",
                                 "enabled": False, "models": {"m": {}}}
    policy["backends"]["child"] = {"type": "openai", "launch": {"model": "demo"},
                                   "models": {"m": {}}}
    gateway = await start_gateway(policy, Settings(port=0, supervise=False))
    _, text = await get(gateway.url)
    states = {dict(labels)["backend"]: dict(labels)["state"]
              for labels, value in samples(text, "routegate_backend_state").items() if value}
    assert states == {"up": "ready", "off": "disabled", "child": "starting"}
    [(labels, value)] = samples(text, "routegate_policy_info").items()
    version = gateway.app[LIVE_POLICY].current.version_hash
    assert value == 1 and dict(labels)["version"] == (version or "none")
    [loaded] = samples(text, "routegate_policy_loaded_timestamp_seconds").values()
    assert loaded > 1.7e9
