"""Fixtures: a fake Anthropic API on loopback and policies that put it behind the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.fakes.anthropic_upstream import AnthropicBehaviour, FakeAnthropic

UPSTREAM_KEY = "sk-ant-upstream"  # the key the gateway holds for the Anthropic backend
MODEL = "claude-haiku-4-5"

StartAnthropic = Callable[..., Awaitable[FakeAnthropic]]


@pytest.fixture
async def start_anthropic() -> AsyncIterator[StartAnthropic]:
    fakes: list[FakeAnthropic] = []

    async def start(behaviour: AnthropicBehaviour | None = None) -> FakeAnthropic:
        fake = FakeAnthropic(behaviour or AnthropicBehaviour(), api_key=UPSTREAM_KEY)
        await fake.start()
        fakes.append(fake)
        return fake

    yield start
    for fake in fakes:
        await fake.stop()


@pytest.fixture
async def anthropic_upstream(start_anthropic: StartAnthropic) -> FakeAnthropic:
    return await start_anthropic()


def anthropic_policy(anthropic_url: str, openai_url: str | None = None,
                     **extra: Any) -> dict[str, Any]:
    """Route `chat` → the Anthropic backend first, then (if given) an OpenAI one."""
    backends: dict[str, Any] = {"claude": {
        "type": "anthropic", "url": anthropic_url, "api_key": UPSTREAM_KEY,
        "models": {MODEL: {"upstream_name": MODEL + "-20251001"}}}}
    targets = [f"claude/{MODEL}"]
    if openai_url is not None:
        backends["gpt"] = {"type": "openai", "url": openai_url,
                           # slower by its priors: the Anthropic backend is the primary
                           "models": {"gpt-4o-mini": {"priors": {"network_ms": 500}}}}
        targets.append("gpt/gpt-4o-mini")
    policy: dict[str, Any] = {
        "version": 1, "backends": backends,
        "routes": {"chat": {"targets": targets, "objective": "fastest"}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
    }
    policy.update(extra)
    return policy
