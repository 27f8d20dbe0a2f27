"""Usage, timings and fallbacks of Anthropic traffic are measured like any other."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningGateway, StartGateway, StartUpstream
from tests.fakes.anthropic_upstream import AnthropicBehaviour, FakeAnthropic
from tests.gateway.anthropic.conftest import StartAnthropic, anthropic_policy

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Say hello to the fake."}]}
MESSAGE = {**CHAT, "max_tokens": 32}


async def _samples(gateway: RunningGateway, name: str) -> dict[tuple[str, ...], float]:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics") as response:
        text = await response.text()
    return {tuple(f"{k}={v}" for k, v in sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name}


async def test_tokens_of_both_apis_are_counted_for_the_anthropic_backend(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    async with aiohttp.ClientSession() as session:
        for path, body in (("/v1/chat/completions", {**CHAT, "stream": True}),
                           ("/v1/messages", {**MESSAGE, "stream": True}),
                           ("/v1/messages", MESSAGE)):
            async with session.post(gateway.url + path, json=body) as response:
                assert response.status == 200
                assert "upstream;dur=" in (await response.text() if body.get("stream")
                                           else response.headers["Server-Timing"])

    tokens = await _samples(gateway, "routegate_tokens_total")
    by_direction = {next(label for label in labels if label.startswith("direction=")): value
                    for labels, value in tokens.items() if "backend=claude" in labels}
    assert by_direction == {"direction=input": 15.0, "direction=output": 18.0}


async def test_a_fallback_from_anthropic_is_counted(
        start_anthropic: StartAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=529))
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(claude.url, gpt.url))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages", json=MESSAGE) as response:
        assert response.status == 200
        assert response.headers["x-routegate-route"] == "gpt/gpt-4o-mini"

    fallbacks = await _samples(gateway, "routegate_fallbacks_total")
    assert fallbacks == {("from_backend=claude", "route=chat", "to_backend=gpt"): 1.0}


async def test_a_candidate_that_cannot_express_the_request_is_no_attempt(
        anthropic_upstream: FakeAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url, gpt.url))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/chat/completions", json={**CHAT, "n": 2}) as response:
        assert response.status == 200
        assert response.headers["x-routegate-route"] == "gpt/gpt-4o-mini"

    # skipped before its attempt began: no fallback from it, never in flight
    assert await _samples(gateway, "routegate_fallbacks_total") == {}
    in_flight = await _samples(gateway, "routegate_in_flight")
    assert ("backend=claude",) not in in_flight and in_flight[("backend=gpt",)] == 0.0
