"""A backend changed by a reload: its old connection pool serves the requests that hold
it, then closes; new requests use the new one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.app import LIVE_POLICY, UPSTREAMS
from gateway.settings import Settings
from gateway.upstream.http1 import Http1Client
from policies.load import loads
from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.waiting import until

STREAM = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def policy_text(url: str, connect_s: float) -> str:
    policy = single_backend_policy(url)
    policy["backends"]["up"]["timeouts"] = {"connect_s": connect_s}
    return yaml.safe_dump(policy)


def session_of(gateway: RunningGateway) -> Http1Client:
    """The connection pool the current policy's `up` backend uses."""
    pool, live = gateway.app[UPSTREAMS], gateway.app[LIVE_POLICY]
    adapter: Any = pool.get("up", live.current.file.backends["up"])
    client: Http1Client = adapter.client()
    return client


async def test_a_retired_session_closes_once_its_stream_has_finished(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream(Behaviour(pause_after_chunk=2))
    gateway = await start_gateway(policy_text(fake.url, 5.0), Settings(port=0))
    async with aiohttp.ClientSession() as client:
        stream = await client.post(gateway.base_url + "/chat/completions", json=STREAM)
        assert stream.status == 200
        await until(lambda: fake.chunks_sent == 2)  # paused mid-stream
        old = session_of(gateway)

        gateway.app[LIVE_POLICY].swap(loads(policy_text(fake.url, 4.0)))  # backend changed
        fake.behaviour.pause_after_chunk = None
        async with client.post(gateway.base_url + "/chat/completions", json=CHAT) as reply:
            assert reply.status == 200
        new = session_of(gateway)
        assert new is not old and not old.closed  # the stream still reads from it

        fake.resume.set()
        text = (await stream.read()).decode()
        stream.release()
        assert "data: [DONE]" in text and "error" not in text
        await until(lambda: old.closed)
        assert not new.closed


def policy_without_up(url: str) -> str:
    return yaml.safe_dump(single_backend_policy(url, backend="other"))


@pytest.mark.parametrize("reloaded", [
    lambda url: policy_text(url, 4.0),  # `up` changed: a new pool replaces the old
    policy_without_up,  # `up` removed: `other` serves
], ids=["changed", "removed"])
async def test_a_pool_the_reload_replaced_or_removed_closes_at_once_when_idle(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        reloaded: Callable[[str], str]) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy_text(fake.url, 5.0), Settings(port=0))
    async with aiohttp.ClientSession() as client:
        async with client.post(gateway.base_url + "/chat/completions", json=CHAT) as reply:
            assert reply.status == 200
        old = session_of(gateway)

        gateway.app[LIVE_POLICY].swap(loads(reloaded(fake.url)))
        async with client.post(gateway.base_url + "/chat/completions", json=CHAT) as reply:
            assert reply.status == 200

    await until(lambda: old.closed)


async def test_a_request_from_before_the_reload_closes_the_removed_backends_pool_after_it(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy_text(fake.url, 5.0), Settings(port=0))
    pool, live = gateway.app[UPSTREAMS], gateway.app[LIVE_POLICY]
    removed = live.current.file.backends["up"]
    live.swap(loads(policy_without_up(fake.url)))
    # a request that took the old policy before the reload reaches the pool only now
    straggler: Any = pool.get("up", removed)
    response = await straggler.open("/chat/completions", b'{"model":"m","messages":[]}')
    await response.read()
    response.release()
    await until(lambda: straggler.idle_closed)
    assert pool.get("up", removed) is not straggler  # never kept for later requests
