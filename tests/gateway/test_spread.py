"""Load spreading in the running gateway, and in `policy explain`."""

from __future__ import annotations

from typing import Any

from gateway.policy.explain import explain_request, render
from tests.conftest import StartGateway, StartUpstream, as_policy

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def policy(first: str, second: str, **route: Any) -> dict[str, Any]:
    def backend(url: str) -> dict[str, Any]:
        return {"type": "openai", "url": url, "models": {"m": {
            "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}}}

    return {"version": 1, "backends": {"a": backend(first), "b": backend(second)},
            "routes": {"chat": {"targets": ["a/m", "b/m"], **route}},
            "auth": {"anonymous": {"enabled": True}}}


async def test_equal_targets_share_the_requests(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="a"), await start_upstream(name="b")
    gateway = await start_gateway(policy(first.url, second.url, spread={"within": "5%"}))

    client = gateway.openai()
    for _ in range(40):
        await client.chat.completions.create(**BODY)

    assert len(first.received) + len(second.received) == 40
    assert min(len(first.received), len(second.received)) >= 8


async def test_without_spread_the_first_of_equals_takes_every_request(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first, second = await start_upstream(name="a"), await start_upstream(name="b")
    gateway = await start_gateway(policy(first.url, second.url))

    client = gateway.openai()
    for _ in range(10):
        await client.chat.completions.create(**BODY)

    assert len(first.received) == 10 and second.received == []


def test_explain_shows_the_spread() -> None:
    loaded = as_policy(policy("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1",
                              spread={"within": 5}, weights={"b/m": 2}))
    text = render(explain_request(loaded, BODY), loaded)
    assert "spread within 5 %: a/m (weight 1, 0 outstanding), b/m (weight 2, 0 outstanding)" \
        in text
