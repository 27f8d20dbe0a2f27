"""`resolve: all`: every address of the URL's host name is a replica, and a changed DNS
answer adds and removes replicas without a reload (the resolver injected; the servers
real, on loopback addresses)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.core.auth import key_hash
from gateway.route.replica_watch import WATCHER
from tests.conftest import RunningGateway, StartGateway
from tests.fakes.openai_upstream import FakeOpenAI
from tests.ports import free_port

ADMIN_KEY = "admin-key-for-tests"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


@pytest.fixture
async def servers() -> AsyncIterator[tuple[int, dict[str, FakeOpenAI]]]:
    """A fake OpenAI server on each loopback address, all on one port (as pods are)."""
    port = free_port()
    fakes = {host: FakeOpenAI(name=host) for host in HOSTS}
    for host, fake in fakes.items():
        await fake.start(host, port)
    yield port, fakes
    for fake in fakes.values():
        await fake.stop()


async def replicas(gateway: RunningGateway) -> set[str]:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/admin/backends",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        body = await response.json()
    return set(body["backends"]["pods"]["fleet"]["replicas"])


async def until(gateway: RunningGateway, wanted: set[str]) -> None:
    for _ in range(100):
        if await replicas(gateway) == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"replicas stayed {await replicas(gateway)}, not {wanted}")


async def test_a_changed_dns_answer_adds_and_removes_replicas(
        servers: tuple[int, dict[str, FakeOpenAI]], start_gateway: StartGateway) -> None:
    port, fakes = servers
    answer = ["127.0.0.1", "127.0.0.2"]

    async def resolver(host: str, asked_port: int) -> list[str]:
        assert (host, asked_port) == ("vllm.models.svc.cluster.local", port)
        return list(answer)

    policy: dict[str, Any] = {
        "version": 1,
        "backends": {"pods": {
            "type": "openai", "deployment": "dedicated", "resolve": "all",
            "url": f"http://vllm.models.svc.cluster.local:{port}/v1", "pick": "round_robin",
            "fleet": {"resolve_interval_s": 0.1, "poll_interval_s": 0.1},
            "models": {"m": {}}}},
        "routes": {"chat": {"targets": ["pods/m"]}},
        "auth": {"anonymous": {"enabled": True}, "admin_keys": [key_hash(ADMIN_KEY)]}}
    gateway = await start_gateway(policy)
    gateway.app[WATCHER].resolver = resolver

    await until(gateway, {f"127.0.0.1:{port}", f"127.0.0.2:{port}"})
    client = gateway.openai()
    for _ in range(4):
        await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}])
    assert [len(fakes[host].received) for host in HOSTS] == [2, 2, 0]

    answer[:] = ["127.0.0.2", "127.0.0.3"]  # a pod replaced
    await until(gateway, {f"127.0.0.2:{port}", f"127.0.0.3:{port}"})
    for _ in range(4):
        await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}])
    assert [len(fakes[host].received) for host in HOSTS] == [2, 4, 2]
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/dashboard/data",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        shown = (await response.json())["fleets"]["pods"]["replicas"]
    assert set(shown) == {f"127.0.0.2:{port}", f"127.0.0.3:{port}"}
