"""Active health checks: a backend failing them leaves routing until it passes again."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from gateway.app import LIVE_POLICY
from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway, StartUpstream, as_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.waiting import until

ADMIN_KEY = "admin-key-for-tests"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
QUICK_CHECKS = {"interval_s": 0.05, "unhealthy_threshold": 2, "healthy_threshold": 2}


def policy(first: str, second: str, *, deployment: str = "dedicated",
           checks: dict[str, Any] | None = None) -> dict[str, Any]:
    def backend(url: str, price: float) -> dict[str, Any]:
        return {"type": "openai", "url": url, "deployment": deployment, "api_key": "sk-test",
                "health_check": checks or QUICK_CHECKS, "models": {"m": {
                    "input_usd_per_mtok": price, "output_usd_per_mtok": price}}}

    return {"version": 1, "backends": {"a": backend(first, 0.0), "b": backend(second, 1.0)},
            "routes": {"chat": {"targets": ["a/m", "b/m"]}},
            "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN_KEY)]}}


async def get(gateway: RunningGateway, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        return await response.json()


async def served_by(gateway: RunningGateway, first: FakeOpenAI) -> bool:
    before = len(first.received)
    await gateway.openai().chat.completions.create(**BODY)
    return len(first.received) > before


async def test_a_backend_failing_its_health_checks_leaves_routing_and_comes_back(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first = await start_upstream(Behaviour(health_status=503), name="first")
    second = await start_upstream(name="second")
    gateway = await start_gateway(policy(first.url, second.url))

    async def first_is_down() -> bool:
        return (await get(gateway, "/readyz"))["backends"]["a"] != "ready"

    await until(first_is_down)
    ready = await get(gateway, "/readyz")
    assert "failing its health checks (health check answered HTTP 503)" in ready["backends"]["a"]
    assert not await served_by(gateway, first)
    health = (await get(gateway, "/admin/backends"))["backends"]["a"]["health"]
    assert health["state"] == "unhealthy" and health["consecutive_failures"] >= 2

    first.behaviour.health_status = 200

    async def first_serves() -> bool:
        return await served_by(gateway, first)

    await until(first_serves)
    assert {path for path, _ in first.gets} == {"/health"}  # on the host, not under /v1


async def test_a_shared_api_is_not_checked_unless_enabled(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="first"), await start_upstream(name="second")
    await start_gateway(policy(first.url, second.url, deployment="shared"))
    await asyncio.sleep(0.3)
    assert first.gets == [] and second.gets == []


async def test_an_enabled_shared_api_is_checked_with_a_cheap_authenticated_models_call(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="first"), await start_upstream(name="second")
    await start_gateway(policy(first.url, second.url, deployment="shared",
                               checks={**QUICK_CHECKS, "enabled": True}))
    await until(lambda: bool(first.gets))
    assert set(first.gets) == {("/v1/models", "Bearer sk-test")}


async def test_checks_keep_their_interval(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="first"), await start_upstream(name="second")
    await start_gateway(policy(first.url, second.url, checks={**QUICK_CHECKS,
                                                               "interval_s": 0.25}))
    await asyncio.sleep(1.0)
    # due at 0, 0.25, 0.5, 0.75 (and 1.0): never more often, and not stopped
    assert 2 <= len(first.gets) <= 5


async def test_a_backend_a_reload_brings_is_checked_at_once(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="first"), await start_upstream(name="second")
    gateway = await start_gateway(policy(first.url, second.url, deployment="shared"))
    await asyncio.sleep(0.2)  # nothing to check: the loop sleeps until the policy changes
    assert first.gets == []
    gateway.app[LIVE_POLICY].swap(as_policy(policy(first.url, second.url, checks={
        **QUICK_CHECKS, "interval_s": 60.0})))

    async def checked() -> bool:
        return bool(first.gets)

    await until(checked, timeout_s=0.5)
