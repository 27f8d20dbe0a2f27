"""A fleet of real local_backend replicas behind one target: the replica that holds the
prompt serves it, tenants' caches stay apart, a dead replica is ejected."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway
from tests.gateway.route.local_replicas import LocalReplica, StartReplicas, start_replicas

__all__ = ["start_replicas"]  # the fixture, used by name below

pytestmark = pytest.mark.slow
ADMIN_KEY = "admin-key-for-tests"
SYSTEM = ("You are the support assistant of a bookshop. Answer briefly and politely, "
          "never invent prices, and ask for the order number first. ") * 6


def fleet_policy(replicas: list[LocalReplica], **backend: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "backends": {"local": {
            "type": "openai", "deployment": "dedicated",
            "urls": [replica.url for replica in replicas],
            "models": {"demo": {}},
            "fleet": {"poll_interval_s": 0.2, "prefix": {"block_chars": 64}},
            **backend}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "tenants": {name: {"api_keys": [key_hash(f"{name}-key")]} for name in ("a", "b")},
        "resilience": {"outlier_detection": {"consecutive_failures": 1,
                                             "base_ejection_s": 30}},
        "auth": {"admin_keys": [key_hash(ADMIN_KEY)]}}


async def ask(gateway: RunningGateway, tenant: str, question: str) -> int:
    """Cached prompt tokens of one answered request."""
    reply = await gateway.openai(f"{tenant}-key").chat.completions.create(
        model="chat", max_tokens=1, messages=[{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": question}])
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens_details.cached_tokens or 0


async def fleet(gateway: RunningGateway) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/backends",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        return (await response.json())["backends"]["local"]["fleet"]["replicas"]


async def test_the_replica_that_holds_a_prompt_serves_it_again_from_its_cache(
        start_replicas: StartReplicas, start_gateway: StartGateway) -> None:
    replicas = await start_replicas(2)
    gateway = await start_gateway(fleet_policy(replicas))

    assert await ask(gateway, "a", "hello") == 0
    cached = [await ask(gateway, "a", f"question {i}") for i in range(3)]
    assert all(tokens > 0 for tokens in cached)
    served = {name: state["requests"] for name, state in (await fleet(gateway)).items()}
    assert sorted(served.values()) == [0, 4]  # all on the replica that holds it


async def test_one_tenants_prompt_never_warms_another_tenants_cache(
        start_replicas: StartReplicas, start_gateway: StartGateway) -> None:
    replicas = await start_replicas(1)
    gateway = await start_gateway(fleet_policy(replicas))

    await ask(gateway, "a", "hello")
    assert await ask(gateway, "b", "hello") == 0
    again = await ask(gateway, "a", "hello")
    usage_prompt = (await fleet(gateway))[replicas[0].name]["prompt_tokens"] // 3
    assert again >= 0.8 * usage_prompt  # nearly all of it


async def test_a_killed_replica_is_ejected_and_its_prompts_move(
        start_replicas: StartReplicas, start_gateway: StartGateway) -> None:
    replicas = await start_replicas(2)
    gateway = await start_gateway(fleet_policy(replicas))
    await ask(gateway, "a", "hello")
    states = await fleet(gateway)
    holder = next(r for r in replicas if states[r.name]["requests"] == 1)
    await holder.kill()

    for i in range(3):  # answered every time: the other replica takes them at once
        await ask(gateway, "a", f"after {i}")
    states = await fleet(gateway)
    # ejected by the failed connect, then down by its failing /health checks too
    assert states[holder.name]["state"] in ("ejected", "unhealthy")
    other = next(r for r in replicas if r is not holder)
    assert states[other.name]["requests"] == 3


async def test_a_salt_is_not_sent_where_the_tenant_shares_its_cache(
        start_replicas: StartReplicas, start_gateway: StartGateway) -> None:
    replicas = await start_replicas(1)
    policy = fleet_policy(replicas)
    policy["routes"]["chat"]["prefix_cache"] = "shared"
    gateway = await start_gateway(policy)

    await ask(gateway, "a", "hello")
    assert await ask(gateway, "b", "hello") > 0


async def test_cached_tokens_are_counted_per_backend_and_replica(
        start_replicas: StartReplicas, start_gateway: StartGateway) -> None:
    replicas = await start_replicas(1)
    gateway = await start_gateway(fleet_policy(replicas))
    await ask(gateway, "a", "hello")
    cached = await ask(gateway, "a", "hello")

    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        text = await response.text()
    assert (f'routegate_cached_prompt_tokens_total{{backend="local",'
            f'replica="{replicas[0].name}"}} {float(cached)}') in text
    assert f'routegate_replica_in_service{{backend="local",replica="{replicas[0].name}"}} 1.0' \
        in text


async def test_a_bad_salt_is_refused_by_the_engine_not_silently_dropped(
        start_replicas: StartReplicas) -> None:
    replicas = await start_replicas(1)
    client = openai.AsyncOpenAI(base_url=replicas[0].url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model="demo", max_tokens=1, messages=[{"role": "user", "content": "hi"}],
            extra_body={"cache_salt": 5})
