"""The tenant's priority reaches a dedicated backend's scheduler as its band: as the
`x-routegate-priority` header (local_backend), as the body's `priority` (vLLM), never to a
shared API, except as OpenAI's `service_tier` where the policy maps it."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.rewrite import spliced_fields, upstream_body, with_fields
from policies.errors import PolicyError
from tests.conftest import StartGateway, StartUpstream, as_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

PRIORITY_HEADER = "x-routegate-priority"
TENANTS = {"vip": "high", "std": "normal", "bulk": "low"}


def _hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def policy(backends: dict[str, dict[str, Any]], targets: list[str] | None = None,
           ) -> dict[str, Any]:
    routes = {name: {"targets": [f"{name}/m"]} for name in backends}
    if targets:
        routes["chain"] = {"targets": targets}
    return {
        "version": 1,
        "backends": {name: {"type": "openai", "models": {"m": {}}, **spec}
                     for name, spec in backends.items()},
        "routes": routes,
        "tenants": {tenant: {"api_keys": [_hash(f"{tenant}-key")], "priority": priority}
                    for tenant, priority in TENANTS.items()},
    }


async def ask(gateway_url: str, route: str, tenant: str, body: dict[str, Any] | None = None,
              ) -> int:
    payload = {"model": route, "messages": [{"role": "user", "content": "hi"}], **(body or {})}
    async with aiohttp.ClientSession() as session, session.post(
            gateway_url + "/v1/chat/completions", json=payload,
            headers={"Authorization": f"Bearer {tenant}-key"}) as response:
        await response.read()
        return response.status


def header(fake: FakeOpenAI) -> str | None:
    headers = {name.lower(): value for name, value in fake.received[-1].headers.items()}
    return headers.get(PRIORITY_HEADER)


async def test_a_dedicated_backend_gets_the_band_as_a_header_by_default(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    local = await start_upstream()
    gateway = await start_gateway(policy({"local": {"url": local.url,
                                                    "deployment": "dedicated"}}))
    bands = {}
    for tenant in TENANTS:
        assert await ask(gateway.url, "local", tenant) == 200
        bands[tenant] = header(local)
        assert "priority" not in local.received[-1].json
    assert bands == {"vip": "0", "std": "1", "bulk": "2"}


async def test_a_vllm_backend_gets_the_band_in_the_body_replacing_the_clients(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    vllm = await start_upstream()
    gateway = await start_gateway(policy({"vllm": {"url": vllm.url, "deployment": "dedicated",
                                                   "priority": "vllm"}}))
    assert await ask(gateway.url, "vllm", "bulk") == 200
    assert vllm.received[-1].json["priority"] == 2 and header(vllm) is None
    assert await ask(gateway.url, "vllm", "bulk", {"priority": -100}) == 200
    assert vllm.received[-1].json["priority"] == 2  # a caller cannot pick its own band
    assert await ask(gateway.url, "vllm", "vip", {"temperature": 0}) == 200
    sent = vllm.received[-1].json
    assert sent["priority"] == 0 and sent["temperature"] == 0 and sent["model"] == "m"


async def test_a_shared_api_gets_no_band_only_a_mapped_service_tier(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    shared = await start_upstream()
    tiered = await start_upstream()
    gateway = await start_gateway(policy({
        "shared": {"url": shared.url},
        "tiered": {"url": tiered.url, "service_tier": {"high": "priority", "low": "flex"}},
    }))
    for tenant in TENANTS:
        assert await ask(gateway.url, "shared", tenant) == 200
        assert header(shared) is None
        assert not {"priority", "service_tier"} & set(shared.received[-1].json)
    tiers = {}
    for tenant in TENANTS:
        assert await ask(gateway.url, "tiered", tenant, {"service_tier": "auto"}) == 200
        assert header(tiered) is None and "priority" not in tiered.received[-1].json
        tiers[tenant] = tiered.received[-1].json.get("service_tier")
    assert tiers == {"vip": "priority", "std": "auto", "bulk": "flex"}


async def test_a_fallback_to_a_shared_api_does_not_carry_the_dedicated_header(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    down = await start_upstream(Behaviour(status=503))
    shared = await start_upstream()
    gateway = await start_gateway(policy(
        {"local": {"url": down.url, "deployment": "dedicated"}, "shared": {"url": shared.url}},
        targets=["local/m", "shared/m"]))
    assert await ask(gateway.url, "chain", "vip") == 200
    assert header(down) == "0"
    assert header(shared) is None


@pytest.mark.parametrize("spec", [{"type": "anthropic", "priority": "vllm"},
                                  {"type": "anthropic", "service_tier": {"high": "priority"}}])
def test_body_carriers_need_an_openai_backend(spec: dict[str, Any]) -> None:
    with pytest.raises(PolicyError, match="need a backend of type openai"):
        as_policy(policy({"a": {"url": "http://127.0.0.1:1", **spec}}))


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                  max_size=3),
    max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["priority", "service_tier", "messages", "n", "x",
                                        "mod\\u0065l", "stream"]) | st.text(max_size=6),
                       _JSON_VALUES, max_size=5),
       st.dictionaries(st.sampled_from(["priority", "service_tier"]),
                       st.integers(0, 2) | st.sampled_from(["flex", "priority"]),
                       min_size=1),
       st.booleans())
def test_the_fields_are_set_whatever_the_client_wrote(
        client: dict[str, Any], fields: dict[str, Any], usage: bool) -> None:
    body = {**client, "model": "chat"}
    raw = orjson.dumps(body)
    encoded = upstream_body(raw, body, "m", add_include_usage=usage)
    sent = orjson.loads(with_fields(encoded, body, fields, spliced_fields(fields)))
    expected = {**orjson.loads(encoded), **fields}
    assert sent == expected
    assert sent["model"] == "m"
