"""Routing by what a backend can do, end to end: the official openai SDK against the
gateway, a real `local_backend --model demo` launched by it (which reports at
`/v1/models` that it has no tools, no vision and a 2048-token context), and a fake
shared OpenAI API that can do everything.

One gateway serves the module: launching the local backend takes seconds.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from gateway.app import LIVE_POLICY, SUPERVISOR, create_app
from gateway.route.hook import ROUTING
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from policies.load import loads
from routing.capabilities import TOOLS
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TOOL: Any = {"type": "function", "function": {"name": "lookup",
                                               "parameters": {"type": "object"}}}
HELLO: Any = [{"role": "user", "content": "hello"}]
IMAGE: Any = [{"role": "user", "content": [
    {"type": "text", "text": "what is in this picture?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
# about 3000 tokens: more than the demo model's 2048-token context
LONG: Any = [{"role": "user", "content": "lorem ipsum dolor sit amet " * 600}]


def policy(shared_url: str, local_url: str | None = None) -> dict[str, Any]:
    """`chat` = [local/demo, shared/m]; `local-only` = [local/demo]. With `local_url`,
    also `direct/demo`: the same local backend as a plain OpenAI-compatible server the
    gateway knows nothing about (so it assumes it can do everything)."""
    backends: dict[str, Any] = {
        "local": {"type": "openai", "deployment": "dedicated", "gpu_hour_usd": 0,
                  "launch": {"model": "demo", "args": ["--threads", "1"],
                             "startup_timeout_s": 120},
                  "models": {"demo": {}}},
        "shared": {"type": "openai", "url": shared_url,
                   "models": {"m": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2}}},
    }
    routes: dict[str, Any] = {"chat": {"targets": ["local/demo", "shared/m"]},
                              "local-only": {"targets": ["local/demo"]}}
    if local_url is not None:
        backends["direct"] = {"type": "openai", "url": local_url, "deployment": "dedicated",
                              "gpu_hour_usd": 0, "models": {"demo": {}}}
        routes["unknown-first"] = {"targets": ["direct/demo", "shared/m"]}
    return {"version": 1, "backends": backends, "routes": routes,
            "auth": {"anonymous": {"enabled": True}},
            "defaults": {"limits": {"requests_per_minute": 10_000,
                                    "tokens_per_minute": 10**8}}}


@dataclass
class Served:
    app: web.Application
    client: openai.AsyncOpenAI
    shared: FakeOpenAI
    local_url: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[Served]:
    shared = FakeOpenAI(Behaviour(reply="from the shared API"), name="shared")
    await shared.start()
    app = create_app(loads(yaml.safe_dump(policy(shared.url)), environ={}),
                     Settings(port=0, launch_command=(sys.executable, "-m", "local_backend")))
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        child = app[SUPERVISOR].children["local"]
        async with asyncio.timeout(120):
            while child.url is None:  # noqa: ASYNC110  (a child process, not an event)
                await asyncio.sleep(0.1)
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
                                    api_key="anonymous", max_retries=0)
        yield Served(app, client, shared, child.url)
    finally:
        await runner.cleanup()
        await shared.stop()


async def route_of(served: Served, **request: Any) -> str:
    reply = await served.client.chat.completions.with_raw_response.create(
        max_tokens=4, **request)
    return str(reply.headers["x-routegate-route"])


async def test_a_plain_request_goes_to_the_local_backend(served: Served) -> None:
    assert await route_of(served, model="chat", messages=HELLO) == "local/demo"


async def test_what_the_launched_backend_reported_is_what_routing_uses(
        served: Served) -> None:
    reported = served.app[ROUTING].reported["local"]
    assert (reported.tools, reported.logprobs, reported.n, reported.context_tokens) == \
        (False, True, 16, 2048)
    # logprobs: nothing assumed of a launched backend until it says so; it said so
    assert await route_of(served, model="local-only", messages=HELLO, logprobs=True,
                          n=2) == "local/demo"


async def test_a_tools_request_is_served_by_the_shared_api(served: Served) -> None:
    before = len(served.shared.received)
    assert await route_of(served, model="chat", messages=HELLO, tools=[TOOL]) == "shared/m"
    assert served.shared.received[before].json["tools"] == [TOOL]


async def test_a_tools_request_on_a_local_only_route_is_a_400_naming_tools(
        served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await served.client.chat.completions.create(model="local-only", messages=HELLO,
                                                    tools=[TOOL])
    assert caught.value.code == "unsupported_parameter"
    assert caught.value.param == "tools"  # type: ignore[attr-defined]
    assert "tools" in caught.value.message and "local/demo" in caught.value.message


async def test_a_vision_request_goes_shared_and_is_a_400_on_the_local_only_route(
        served: Served) -> None:
    assert await route_of(served, model="chat", messages=IMAGE) == "shared/m"
    with pytest.raises(openai.BadRequestError) as caught:
        await served.client.chat.completions.create(model="local-only", messages=IMAGE)
    assert caught.value.param == "messages"  # type: ignore[attr-defined]
    assert "vision" in caught.value.message


async def test_a_prompt_over_the_local_context_falls_back_and_over_every_context_is_a_400(
        served: Served) -> None:
    assert await route_of(served, model="chat", messages=LONG) == "shared/m"
    with pytest.raises(openai.BadRequestError) as caught:
        await served.client.chat.completions.create(model="local-only", messages=LONG)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"  # type: ignore[attr-defined]


async def test_a_backend_that_answers_it_cannot_falls_back_and_is_remembered_until_reload(
        served: Served) -> None:
    live = served.app[LIVE_POLICY]
    live.swap(loads(yaml.safe_dump(policy(served.shared.url, served.local_url)), environ={}))
    routing = served.app[ROUTING]

    # the local backend refuses `tools` with a 400 naming it: nothing sent yet, so the
    # next candidate serves, and the target is known to lack tools from then on
    assert await route_of(served, model="unknown-first", messages=HELLO,
                          tools=[TOOL]) == "shared/m"
    assert routing.learned.lacks == {"direct/demo": TOOLS}
    # it says `context_length_exceeded` for the long prompt: the same
    assert await route_of(served, model="unknown-first", messages=LONG) == "shared/m"
    assert "direct/demo" in routing.learned.context_below
    assert await route_of(served, model="unknown-first", messages=HELLO) == "direct/demo"

    live.swap(loads(yaml.safe_dump(policy(served.shared.url, served.local_url)), environ={}))
    await route_of(served, model="unknown-first", messages=HELLO)
    assert routing.learned.lacks == {}  # a reload forgets what was learned
