"""A finished request leaves no reference cycle behind: everything it allocated is freed
by refcounting at once. (A cycle through the request or its context leaves the whole
request's object graph — dozens of objects — to the cyclic garbage collector, which
at load costs more CPU than some whole pipeline steps.)"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import aiohttp
import pytest

from tests.conftest import StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
OURS = ("gateway.", "routing.", "policies.", "aiohttp.web")


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """What the cyclic collector would free, kept in `gc.garbage` instead."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def ours_in(garbage: list[object]) -> list[str]:
    gc.collect()
    return sorted({type(obj).__module__ + "." + type(obj).__qualname__ for obj in garbage
                   if type(obj).__module__.startswith(OURS)})


async def test_json_stream_and_refused_requests_leave_no_cycles(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        saved_garbage: list[object]) -> None:
    fake = await start_upstream(Behaviour())
    gateway = await start_gateway(single_backend_policy(fake.url))
    url = gateway.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as client:
        async with client.post(url, json=CHAT) as reply:  # warm: pools, caches
            assert reply.status == 200
        gc.collect()
        saved_garbage.clear()
        for _ in range(3):
            async with client.post(url, json=CHAT) as reply:
                assert reply.status == 200
                await reply.read()
            async with client.post(url, json={**CHAT, "stream": True}) as reply:
                assert reply.status == 200
                assert b"[DONE]" in await reply.read()
            async with client.post(url, json={**CHAT, "model": "nope"}) as reply:
                assert reply.status == 404
            async with client.post(url, data=b"{not json") as reply:
                assert reply.status == 400
    assert ours_in(saved_garbage) == []
