"""Who may use what: allow-lists per tenant and key, 404 for the rest, /v1/models per
caller, and compliance rules that hold however a target is named."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from policies.keys import hash_key
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import FakeOpenAI

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


def two_regions(eu: FakeOpenAI, us: FakeOpenAI) -> dict[str, Any]:
    """`chat` over an EU and a US backend; tenant `acme` (tag eu) is bound to EU regions
    on `chat` and may name every target; `globex` may use `chat*` routes only, and its
    key `g2` also `eu/m` by name."""
    return {
        "version": 1,
        "backends": {
            "eu": {"type": "openai", "url": eu.url, "region": "eu-west-1",
                   "models": {"m": {"input_usd_per_mtok": 2}}},
            "us": {"type": "openai", "url": us.url, "region": "us-east-1",
                   "models": {"m": {"input_usd_per_mtok": 1}}},
        },
        "routes": {"chat": {"targets": ["eu/m", "us/m"]},
                   "chat-us": {"targets": ["us/m"]},
                   "batch": {"targets": ["us/m"]}},
        "compliance": {"rules": [{"name": "eu-chat", "when": {"tenant_tags": ["eu"],
                                                             "routes": ["chat"]},
                                  "require": {"regions": ["eu-*"]}}]},
        "tenants": {
            "acme": {"api_keys": [hash_key("a1")], "tags": ["eu"], "allow_targets": ["*"]},
            "globex": {"api_keys": [hash_key("g1"), hash_key("g2")], "allow": ["chat*"],
                       "key_access": {hash_key("g2"): {"allow_targets": ["eu/*"]}}},
        },
    }


@pytest.fixture
async def regions(start_upstream: StartUpstream) -> tuple[FakeOpenAI, FakeOpenAI]:
    return await start_upstream(name="eu"), await start_upstream(name="us")


async def test_a_route_bound_to_eu_stays_in_eu_when_a_us_target_is_named_directly(
        regions: tuple[FakeOpenAI, FakeOpenAI], start_gateway: StartGateway) -> None:
    eu, us = regions
    gateway = await start_gateway(two_regions(eu, us))
    client = gateway.openai(api_key="a1")

    with pytest.raises(openai.PermissionDeniedError) as caught:
        await client.chat.completions.create(model="us/m", messages=MESSAGES)

    assert "eu-chat" in caught.value.message
    assert us.received == []
    reply = await client.chat.completions.with_raw_response.create(
        model="eu/m", messages=MESSAGES)
    assert reply.headers["x-routegate-route"] == "eu/m"


async def test_a_route_the_rule_does_not_scope_is_not_bound_by_it(
        regions: tuple[FakeOpenAI, FakeOpenAI], start_gateway: StartGateway) -> None:
    eu, us = regions
    gateway = await start_gateway(two_regions(eu, us))
    reply = await gateway.openai(api_key="a1").chat.completions.with_raw_response.create(
        model="batch", messages=MESSAGES)
    assert reply.headers["x-routegate-route"] == "us/m"


async def test_what_a_tenant_may_not_use_is_a_404_and_missing_from_its_model_list(
        regions: tuple[FakeOpenAI, FakeOpenAI], start_gateway: StartGateway) -> None:
    eu, us = regions
    gateway = await start_gateway(two_regions(eu, us))
    globex = gateway.openai(api_key="g1")

    for model in ("batch", "us/m", "eu/m"):
        with pytest.raises(openai.NotFoundError) as caught:
            await globex.chat.completions.create(model=model, messages=MESSAGES)
        assert caught.value.code == "model_not_found"
    assert us.received == [] and eu.received == []
    assert [m.id async for m in globex.models.list()] == ["chat", "chat-us"]
    assert [m.id async for m in gateway.openai(api_key="a1").models.list()] == \
        ["chat", "chat-us", "batch", "eu/m", "us/m"]


async def test_a_keys_own_access_overrides_its_tenants(
        regions: tuple[FakeOpenAI, FakeOpenAI], start_gateway: StartGateway) -> None:
    eu, us = regions
    gateway = await start_gateway(two_regions(eu, us))
    key = gateway.openai(api_key="g2")

    await key.chat.completions.create(model="eu/m", messages=MESSAGES)

    assert len(eu.received) == 1
    assert [m.id async for m in key.models.list()] == ["chat", "chat-us", "eu/m"]
    with pytest.raises(openai.NotFoundError):
        await key.chat.completions.create(model="us/m", messages=MESSAGES)
