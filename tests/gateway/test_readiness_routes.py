"""`/readyz` per route and per tenant: not ready while a route, or a tenant's only
compliant targets, have no ready backend (`server.readyz: all_routes`, the default);
`server.readyz: any` is ready with one backend up."""

from __future__ import annotations

from typing import Any

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.launch.supervisor import free_port
from gateway.route.readiness import readiness
from policies.load import loads
from tests.conftest import StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI


async def readyz(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + "/readyz") as response:
        return response.status, await response.json()


def two_routes(up_url: str, **server: Any) -> dict[str, Any]:
    """`chat` served by a backend that answers, `summarise` by one nothing listens for."""
    policy = single_backend_policy(up_url)
    policy["backends"]["down"] = {"type": "openai", "url": f"http://127.0.0.1:{free_port()}/v1",
                                  "models": {"m": {}}}
    policy["routes"]["summarise"] = {"targets": ["down/m"]}
    if server:
        policy["server"] = server
    return policy


def eu_tenant(up_url: str, **server: Any) -> dict[str, Any]:
    """One route over a US backend that answers and an EU one that does not; the tenant
    `eu` may only use EU regions."""
    policy = single_backend_policy(up_url)
    policy["backends"]["up"]["region"] = "us"
    policy["backends"]["eu"] = {"type": "openai", "url": f"http://127.0.0.1:{free_port()}/v1",
                                "region": "eu-west-1", "models": {"m": {}}}
    policy["routes"]["chat"]["targets"].append("eu/m")
    policy["compliance"] = {"rules": [{"name": "eu-stays-in-eu", "when": {"tenant_tags": ["eu"]},
                                       "require": {"regions": ["eu-*"]}}]}
    policy["tenants"] = {"eu": {"tags": ["eu"]}, "us": {}}
    if server:
        policy["server"] = server
    return policy


async def test_a_route_without_a_ready_backend_keeps_the_gateway_not_ready(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(two_routes(openai_upstream.url))
    status, body = await readyz(gateway.url)
    assert status == 503 and body["status"] == "not ready"
    assert body["routes"]["chat"] == "ready"
    assert body["routes"]["summarise"].startswith("no target is ready (down/m: backend 'down': "
                                                  "cannot connect to")


async def test_readyz_any_is_ready_with_one_backend_up(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(two_routes(openai_upstream.url, readyz="any"))
    status, body = await readyz(gateway.url)
    assert status == 200 and body["routes"]["summarise"] != "ready"


async def test_a_tenant_whose_only_compliant_target_is_down_keeps_the_gateway_not_ready(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(eu_tenant(openai_upstream.url))
    status, body = await readyz(gateway.url)
    assert status == 503
    assert body["routes"] == {"chat": "ready"}  # the US backend serves everyone else
    assert list(body["tenants"]) == ["eu"]
    assert "route 'chat'" in body["tenants"]["eu"] and "eu/m" in body["tenants"]["eu"]
    assert "up/" not in body["tenants"]["eu"]


async def test_every_route_and_tenant_served_is_ready(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = eu_tenant(openai_upstream.url)
    policy["backends"]["eu"]["url"] = openai_upstream.url  # the EU backend answers too
    gateway = await start_gateway(policy)
    status, body = await readyz(gateway.url)
    assert status == 200 and "tenants" not in body


POLICY = """
version: 1
backends:
  a: {type: openai, url: "http://127.0.0.1:1/v1", region: eu-west-1, models: {m: {}}}
  b: {type: openai, url: "http://127.0.0.1:2/v1", region: us, models: {m: {}}}
  c: {type: openai, url: "http://127.0.0.1:3/v1", region: eu-central-1, models: {m: {}}}
routes:
  r1: {targets: [a/m, b/m]}
  r2: {targets: [c/m]}
  r3: {targets: [b/m, c/m]}
compliance:
  rules: [{name: eu, when: {tenant_tags: [eu]}, require: {regions: ["eu-*"]}}]
tenants:
  t-eu: {tags: [eu]}
  t-any: {}
"""
BACKENDS = ("a", "b", "c")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(up=st.sets(st.sampled_from(BACKENDS)), ejected=st.sets(st.sampled_from(
    ["a/m", "b/m", "c/m"])))
def test_ready_exactly_when_every_route_and_every_tenant_has_a_serving_target(
        up: set[str], ejected: set[str]) -> None:
    """Against a brute-force reading of the rule: for each (tenant or nobody, route), some
    target the tenant may use has its backend up and is not ejected."""
    policy = loads(POLICY)
    backends = {name: "ready" if name in up else "down" for name in BACKENDS}
    serving = {f"{name}/m" for name in up} - ejected
    eu_ok = {"a/m", "c/m"}
    routes = {"r1": {"a/m", "b/m"}, "r2": {"c/m"}, "r3": {"b/m", "c/m"}}
    every_route = all(targets & serving for targets in routes.values())
    eu_tenant_ok = all(targets & eu_ok & serving for targets in routes.values()
                       if targets & eu_ok)
    state = readiness(policy, backends, ejected)
    assert state.ready == (bool(up) and every_route and eu_tenant_ok)
    assert ("t-eu" in state.tenants) == (not eu_tenant_ok)
    assert "t-any" not in state.tenants
