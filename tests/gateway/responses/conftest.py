"""Fixtures: a fake native Responses backend, and policies putting backends behind `chat`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.anthropic.conftest import start_anthropic

__all__ = ["native_upstream", "responses_policy", "start_anthropic"]

WEATHER_TOOL: Any = {"type": "function", "name": "get_weather",
                     "description": "The weather in a city.",
                     "parameters": {"type": "object",
                                    "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}


@pytest.fixture
async def native_upstream() -> AsyncIterator[FakeResponses]:
    fake = FakeResponses()
    await fake.start()
    yield fake
    await fake.stop()


def responses_policy(native_url: str | None = None, chat_url: str | None = None,
                     **extra: Any) -> dict[str, Any]:
    """Route `chat` → the native Responses backend first (if given), then the chat one."""
    backends: dict[str, Any] = {}
    targets = []
    if native_url is not None:
        backends["native"] = {"type": "openai", "url": native_url, "responses": "native",
                              "models": {"gpt-5": {}}}
        targets.append("native/gpt-5")
    if chat_url is not None:
        backends["plain"] = {"type": "openai", "url": chat_url,
                             "models": {"llama": {"priors": {"network_ms": 500}}}}
        targets.append("plain/llama")
    policy: dict[str, Any] = {
        "version": 1, "backends": backends,
        "routes": {"chat": {"targets": targets, "objective": "fastest"}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
    }
    policy.update(extra)
    return policy
