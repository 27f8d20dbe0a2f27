"""`/readyz`: ready only when some backend can really take requests, and why not."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.launch.supervisor import free_port
from tests.conftest import StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI


async def readyz(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url + "/readyz") as response:
        return response.status, await response.json()


async def test_a_reachable_backend_is_ready(openai_upstream: FakeOpenAI,
                                            start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url))
    status, body = await readyz(gateway.url)
    assert (status, body["status"], body["backends"]) == (200, "ready", {"up": "ready"})


async def test_a_backend_nothing_listens_for_is_not_ready_and_says_why(
        start_gateway: StartGateway) -> None:
    port = free_port()  # closed again: connections are refused
    gateway = await start_gateway(single_backend_policy(f"http://127.0.0.1:{port}/v1"))
    status, body = await readyz(gateway.url)
    assert status == 503 and body["status"] == "not ready"
    assert body["backends"]["up"].startswith(f"cannot connect to 127.0.0.1:{port}")


async def test_an_enabled_backend_with_an_empty_api_key_is_not_ready(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url)
    policy["backends"]["up"]["api_key"] = ""  # `${OPENAI_API_KEY:-}` with the key unset
    gateway = await start_gateway(policy)
    status, body = await readyz(gateway.url)
    assert status == 503 and "empty api_key" in body["backends"]["up"]


async def test_one_unreachable_backend_leaves_the_gateway_ready_on_the_others(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url)
    policy["backends"]["gone"] = {"type": "openai", "url": f"http://127.0.0.1:{free_port()}",
                                  "models": {"m": {}}}
    gateway = await start_gateway(policy)
    status, body = await readyz(gateway.url)
    assert status == 200 and body["backends"]["up"] == "ready"
    assert body["backends"]["gone"].startswith("cannot connect to")
