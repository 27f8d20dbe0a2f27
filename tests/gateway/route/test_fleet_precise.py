"""`precise: true`: the prefix index follows what each local_backend replica really
holds. A prompt the replica evicted (because other work took its cache) leaves the
index within a poll; without `precise` the index keeps believing it is there."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.conftest import StartGateway
from tests.gateway.route.local_replicas import StartReplicas, start_replicas
from tests.gateway.route.test_fleet_replicas import ADMIN_KEY, SYSTEM, ask, fleet_policy

__all__ = ["start_replicas"]  # the fixture, used by name below

pytestmark = pytest.mark.slow


async def backend_report(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
            url + "/admin/backends",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        report: dict[str, Any] = (await response.json())["backends"]["local"]["fleet"]
        return report


async def flood(replica_url: str, prompts: int) -> None:
    """Long prompts sent to the replica directly, past the gateway: they take its cache."""
    async with aiohttp.ClientSession() as session:
        for i in range(prompts):
            body = {"model": "demo", "max_tokens": 1, "messages": [
                {"role": "system", "content": f"Unrelated instructions number {i}. " * 20},
                {"role": "user", "content": "go"}]}
            async with session.post(replica_url + "/chat/completions", json=body) as response:
                assert response.status == 200


@pytest.mark.parametrize("precise", [True, False])
async def test_an_evicted_prompt_leaves_the_index_only_when_precise(
        start_replicas: StartReplicas, start_gateway: StartGateway, precise: bool) -> None:
    replicas = await start_replicas(1, "--num-blocks", "64")  # 1,024 tokens: one long prompt
    policy = fleet_policy(replicas)
    policy["backends"]["local"]["fleet"]["prefix"]["precise"] = precise
    gateway = await start_gateway(policy)
    name = replicas[0].name

    await ask(gateway, "a", "hello")
    await asyncio.sleep(0.6)  # a few polls: the replica's log says it stored the prompt
    report = await backend_report(gateway.url)
    assert report["precise"] is precise
    held = report["replicas"][name]["index_blocks"]
    assert held >= len(SYSTEM) // 64 - 2

    await flood(replicas[0].url, 4)
    await asyncio.sleep(0.6)
    after = (await backend_report(gateway.url))["replicas"][name]["index_blocks"]
    assert after == (0 if precise else held)
    # and the replica agrees: asked again, the prompt is not served from its cache
    assert await ask(gateway, "a", "hello again") < len(SYSTEM) // 8
