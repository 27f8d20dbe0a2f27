"""Shared fixtures: fake upstreams on loopback and the gateway in front of them.

    async def test_x(openai_upstream, start_gateway):
        gateway = await start_gateway(single_backend_policy(openai_upstream.url))
        client = gateway.openai()           # openai.AsyncOpenAI against the gateway
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import yaml
from aiohttp import web

from gateway.app import create_app
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from policies.load import Policy, loads
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

# `redis_server`: a real redis-server on a free loopback port, per test.
# `redis_cluster` / `shared_redis_cluster`: a real 3-master Redis Cluster.
pytest_plugins = ("tests.redis_server", "tests.redis_cluster")


@pytest.fixture(autouse=True, scope="session")
def _data_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`routegate serve` children the tests start keep keys, spend, audit lines and
    batches in a scratch data directory, never the user's (`ROUTEGATE_DATA_DIR`)."""
    os.environ["ROUTEGATE_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))


def single_backend_policy(url: str, *, models: tuple[str, ...] = ("gpt-4o-mini",),
                          backend: str = "up", **extra: Any) -> dict[str, Any]:
    """One OpenAI-compatible backend, a `chat` route to its first model, anonymous
    loopback access; `extra` adds or replaces top-level sections."""
    policy: dict[str, Any] = {
        "version": 1,
        "backends": {backend: {"type": "openai", "url": url,
                               "models": {model: {} for model in models}}},
        "routes": {"chat": {"targets": [f"{backend}/{models[0]}"]}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
    }
    policy.update(extra)
    return policy


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
StartScripted = Callable[[Handler], Awaitable[str]]


@pytest.fixture
async def scripted_upstream() -> AsyncIterator[StartScripted]:
    """`url = await scripted_upstream(handler)`: a backend answering chat completions
    with `handler`, for replies no fake produces (cut bodies, odd framing); its base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


def as_policy(policy: str | dict[str, Any] | Policy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    text = policy if isinstance(policy, str) else yaml.safe_dump(policy, sort_keys=False)
    return loads(text, environ={})


@dataclass
class RunningGateway:
    app: web.Application
    url: str  # http://127.0.0.1:<port>

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def openai(self, api_key: str = "anonymous", **kwargs: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key, max_retries=0,
                                  **kwargs)


StartGateway = Callable[..., Awaitable[RunningGateway]]
StartUpstream = Callable[..., Awaitable[FakeOpenAI]]


@pytest.fixture
async def start_upstream() -> AsyncIterator[StartUpstream]:
    """`await start_upstream(Behaviour(...), name=...)`: a fresh fake, stopped afterwards."""
    fakes: list[FakeOpenAI] = []

    async def start(behaviour: Behaviour | None = None, name: str = "fake") -> FakeOpenAI:
        fake = FakeOpenAI(behaviour or Behaviour(), name=name)
        await fake.start()
        fakes.append(fake)
        return fake

    yield start
    for fake in fakes:
        await fake.stop()


@pytest.fixture
async def openai_upstream(start_upstream: StartUpstream) -> FakeOpenAI:
    return await start_upstream()


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """`await start_gateway(policy, settings=None)`: the real app on a free loopback port.

    `policy` is YAML text, a dict (see `single_backend_policy`) or a loaded `Policy`.
    """
    runners: list[web.AppRunner] = []

    async def start(policy: str | dict[str, Any] | Policy,
                    settings: Settings | None = None) -> RunningGateway:
        app = create_app(as_policy(policy), settings or Settings(port=0))
        runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return RunningGateway(app=app, url=f"http://127.0.0.1:{port}")

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def gateway(openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> RunningGateway:
    """The gateway with the default single-backend policy in front of `openai_upstream`."""
    return await start_gateway(single_backend_policy(openai_upstream.url))
