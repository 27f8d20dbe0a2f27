"""Routing sees the gateway's own queue: attempts waiting for a slot are the target's
queue depth (they predict its TTFT), attempts sent are its in-flight count."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from gateway.core.auth import key_hash
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour

ADMIN_KEY = "admin-key-for-tests"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


async def test_requests_waiting_for_a_slot_are_the_targets_queue_depth(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    slow = await start_upstream(Behaviour(first_byte_delay_s=1.0))
    gateway = await start_gateway({
        "version": 1,
        "backends": {"a": {"type": "openai", "url": slow.url, "deployment": "dedicated",
                           "max_concurrency": 1, "models": {"m": {}}}},
        "routes": {"chat": {"targets": ["a/m"]}},
        "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN_KEY)]}})

    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(gateway.url + "/v1/chat/completions",
                                    json=BODY) as response:
                await response.read()
                return response.status

        async def target() -> dict[str, Any]:
            async with session.get(gateway.url + "/admin/backends", headers={
                    "Authorization": f"Bearer {ADMIN_KEY}"}) as response:
                return (await response.json())["backends"]["a"]["targets"]["a/m"]

        requests = [asyncio.create_task(one()) for _ in range(3)]
        for _ in range(50):
            await asyncio.sleep(0.02)
            state = await target()
            if state["queue_depth"] == 2:
                break
        assert (state["in_flight"], state["queue_depth"]) == (1, 2)
        assert await asyncio.gather(*requests) == [200] * 3
        state = await target()
        assert (state["in_flight"], state["queue_depth"]) == (0, 0)
