"""Shadow mode: a candidate policy decides live traffic too, never changing a response."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.policy.admin import SHADOW
from gateway.settings import Settings
from policies import hash_key
from tests.conftest import StartGateway, StartUpstream

ADMIN_KEY = "rg-admin-shadow"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def two_backends(url_a: str, url_b: str, *, price_a: float, price_b: float) -> dict[str, Any]:
    return {
        "version": 1,
        "backends": {
            "a": {"type": "openai", "url": url_a,
                  "models": {"m": {"input_usd_per_mtok": price_a, "output_usd_per_mtok": price_a}}},
            "b": {"type": "openai", "url": url_b,
                  "models": {"m": {"input_usd_per_mtok": price_b, "output_usd_per_mtok": price_b}}},
        },
        "routes": {"chat": {"targets": ["a/m", "b/m"], "objective": "cheapest"}},
        "auth": {"anonymous": {"enabled": True}, "admin_keys": [hash_key(ADMIN_KEY)]},
        "defaults": {"limits": {"requests_per_minute": 100_000, "tokens_per_minute": 10**8},
                     "allow_targets": ["*"]},
    }


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def test_shadow_counts_differing_decisions_without_changing_responses(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    one, two = await start_upstream(name="a"), await start_upstream(name="b")
    live = two_backends(one.url, two.url, price_a=0.1, price_b=1.0)
    shadow_path = write_yaml(tmp_path / "shadow.yaml",
                             two_backends(one.url, two.url, price_a=1.0, price_b=0.1))
    gateway = await start_gateway(live, Settings(port=0, shadow_policy_path=shadow_path,
                                                 supervise=False))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        for model in ("chat", "chat", "a/m"):
            async with session.post(gateway.base_url + "/chat/completions",
                                    json={**body, "model": model}) as response:
                assert response.status == 200
        async with session.get(gateway.url + "/admin/policy/shadow", headers=ADMIN) as response:
            report = await response.json()
    assert len(one.received) == 3 and two.received == []  # the live policy served them all
    assert (report["decisions"], report["same"], report["different"]) == (3, 1, 2)
    sample = report["samples"][0]
    assert (sample["live"]["outcome"], sample["shadow"]["outcome"]) == ("a/m", "b/m")
    assert "hi" not in str(report)  # no request content
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        exposition = await response.text()
    assert 'routegate_policy_shadow_decisions_total{result="different"} 2.0' in exposition
    assert gateway.app[SHADOW].different == 2


async def test_shadow_endpoint_without_a_shadow_policy_is_404(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    one = await start_upstream()
    gateway = await start_gateway(two_backends(one.url, one.url, price_a=1, price_b=2))
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/policy/shadow", headers=ADMIN) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "no_shadow_policy"


async def test_shadow_follows_the_candidate_policys_tenant_route_override(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    one, two = await start_upstream(name="a"), await start_upstream(name="b")
    live = two_backends(one.url, two.url, price_a=0.1, price_b=1.0)
    candidate = two_backends(one.url, two.url, price_a=0.1, price_b=1.0)
    # The candidate sends the anonymous tenant's `chat` to a route served by `b` only.
    candidate["routes"]["chat-b"] = {"targets": ["b/m"], "expected_output_tokens": 64}
    candidate["tenants"] = {"anonymous": {"routes": {"chat": "chat-b"}}}
    shadow_path = write_yaml(tmp_path / "shadow.yaml", candidate)
    gateway = await start_gateway(live, Settings(port=0, shadow_policy_path=shadow_path,
                                                 supervise=False))
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(gateway.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
        async with session.get(gateway.url + "/admin/policy/shadow", headers=ADMIN) as response:
            report = await response.json()
    assert report["different"] == 1
    sample = report["samples"][0]
    assert (sample["live"]["outcome"], sample["shadow"]["outcome"]) == ("a/m", "b/m")
