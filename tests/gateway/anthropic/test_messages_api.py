"""The official `anthropic` SDK → the gateway's `/v1/messages` → any backend."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import pytest

from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.anthropic_upstream import AnthropicBehaviour, FakeAnthropic
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.anthropic.conftest import MODEL, StartAnthropic, anthropic_policy

GATEWAY_KEY = "sk-gw-acme"
MESSAGES: Any = [{"role": "user", "content": "Say hello to the fake."}]


def client(gateway: RunningGateway, api_key: str = GATEWAY_KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=api_key, max_retries=0)


def keyed(policy: dict[str, Any], **tenant: Any) -> dict[str, Any]:
    """The policy with anonymous access off and one tenant holding GATEWAY_KEY."""
    return {**policy, "auth": {"anonymous": {"enabled": False}},
            "tenants": {"acme": {"api_keys": [key_hash(GATEWAY_KEY)], **tenant}}}


async def test_a_message_is_served_by_an_openai_backend(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))

    reply = await client(gateway).messages.create(
        model="chat", max_tokens=64, system="Be brief.", messages=MESSAGES)

    assert reply.type == "message" and reply.role == "assistant"
    assert reply.content[0].type == "text"
    assert reply.content[0].text == openai_upstream.behaviour.reply
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (7, 9)
    sent = openai_upstream.received[-1].json
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Say hello to the fake."}]
    assert sent["max_tokens"] == 64 and sent["model"] == "gpt-4o-mini"


async def test_a_message_is_served_by_an_anthropic_backend(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(anthropic_policy(anthropic_upstream.url)))

    reply = await client(gateway).messages.create(
        model="chat", max_tokens=64, system="Be brief.", messages=MESSAGES,
        stop_sequences=["END"], metadata={"user_id": "u-1"}, extra_body={"temperature": 0.2})

    assert reply.content[0].type == "text"
    assert reply.content[0].text == "Hello from the fake Anthropic upstream."
    assert reply.model == MODEL + "-20251001"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (7, 6)
    sent = anthropic_upstream.received[-1].json
    assert (sent["system"], sent["max_tokens"], sent["temperature"]) == ("Be brief.", 64, 0.2)
    assert sent["stop_sequences"] == ["END"] and sent["metadata"] == {"user_id": "u-1"}


@pytest.mark.parametrize("backend", ["openai", "anthropic"])
async def test_a_streamed_message_arrives_as_messages_events(
        openai_upstream: FakeOpenAI, anthropic_upstream: FakeAnthropic,
        start_gateway: StartGateway, backend: str) -> None:
    policy = (single_backend_policy(openai_upstream.url) if backend == "openai"
              else anthropic_policy(anthropic_upstream.url))
    gateway = await start_gateway(keyed(policy))

    async with client(gateway).messages.stream(
            model="chat", max_tokens=64, messages=MESSAGES) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()

    expected = (openai_upstream.behaviour.reply if backend == "openai"
                else "Hello from the fake Anthropic upstream.")
    assert text == expected
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens == 5 and final.usage.output_tokens == len(expected.split())


async def test_the_event_stream_has_anthropics_event_sequence(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages", headers={"x-api-key": GATEWAY_KEY},
            json={"model": "chat", "max_tokens": 64, "messages": MESSAGES,
                  "stream": True}) as response:
        raw = await response.text()

    kinds = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    deltas = len(openai_upstream.behaviour.reply.split())
    assert kinds == (["message_start", "content_block_start"] + ["content_block_delta"] * deltas
                     + ["content_block_stop", "message_delta", "message_stop"])
    assert response.headers["Content-Type"] == "text/event-stream"
    assert "[DONE]" not in raw


async def test_a_tool_call_round_trips_through_both_translations(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(tool_call=("weather", {"city": "Oslo"})))
    gateway = await start_gateway(keyed(anthropic_policy(claude.url)))
    tools: Any = [{"name": "weather", "description": "Weather by city",
                   "input_schema": {"type": "object",
                                    "properties": {"city": {"type": "string"}}}}]

    reply = await client(gateway).messages.create(
        model="chat", max_tokens=64, messages=MESSAGES, tools=tools,
        tool_choice={"type": "any"})
    async with client(gateway).messages.stream(
            model="chat", max_tokens=64, messages=MESSAGES, tools=tools) as stream:
        streamed = await stream.get_final_message()

    for message in (reply, streamed):
        assert message.stop_reason == "tool_use"
        use = message.content[-1]
        assert use.type == "tool_use" and (use.name, use.input) == ("weather", {"city": "Oslo"})
    sent = claude.received[0].json
    assert sent["tools"] == tools and sent["tool_choice"] == {"type": "any"}


async def test_a_tool_result_turn_reaches_an_openai_backend_as_a_tool_message(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))
    turns: Any = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Sunny"}]}]

    await client(gateway).messages.create(model="chat", max_tokens=64, messages=turns)

    assert openai_upstream.received[-1].json["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}]


async def test_a_wrong_key_is_an_authentication_error(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))

    with pytest.raises(anthropic.AuthenticationError) as caught:
        await client(gateway, api_key="sk-wrong").messages.create(
            model="chat", max_tokens=64, messages=MESSAGES)

    assert caught.value.body == {"type": "error", "request_id": caught.value.request_id,
                                 "error": {"type": "authentication_error",
                                           "message": "Incorrect API key provided."}}
    assert openai_upstream.received == []


async def test_an_unknown_model_is_a_not_found_error(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))

    with pytest.raises(anthropic.NotFoundError) as caught:
        await client(gateway).messages.create(
            model="claude-nonexistent", max_tokens=64, messages=MESSAGES)

    assert "claude-nonexistent" in caught.value.message


async def test_a_missing_max_tokens_is_a_bad_request(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages", headers={"x-api-key": GATEWAY_KEY},
            json={"model": "chat", "messages": MESSAGES}) as response:
        status, body = response.status, await response.json()

    assert status == 400
    assert body["error"] == {"type": "invalid_request_error",
                             "message": "max_tokens: Field required (a positive integer)"}


async def test_the_tenants_rate_limit_is_a_rate_limit_error(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = keyed(single_backend_policy(openai_upstream.url),
                   limits={"requests_per_minute": 1})
    gateway = await start_gateway(policy)
    sdk = client(gateway)
    await sdk.messages.create(model="chat", max_tokens=64, messages=MESSAGES)

    with pytest.raises(anthropic.RateLimitError) as caught:
        await sdk.messages.create(model="chat", max_tokens=64, messages=MESSAGES)

    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert int(caught.value.response.headers["Retry-After"]) > 0


async def test_all_backends_failing_is_an_internal_server_error(
        start_anthropic: StartAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=529))
    gateway = await start_gateway(keyed(anthropic_policy(claude.url)))

    with pytest.raises(anthropic.InternalServerError) as caught:
        await client(gateway).messages.create(model="chat", max_tokens=64, messages=MESSAGES)

    assert caught.value.status_code == 502
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]


async def test_count_tokens_estimates_the_input(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))
    sdk = client(gateway)

    short = await sdk.messages.count_tokens(model="chat", messages=MESSAGES)
    longer = await sdk.messages.count_tokens(model="chat", system="Be brief. " * 20,
                                             messages=MESSAGES)

    assert 5 <= short.input_tokens < longer.input_tokens
    assert openai_upstream.received == []


async def test_a_backend_failing_mid_stream_ends_the_stream_with_an_error_event(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    dying = await start_upstream(Behaviour(drop_after_chunks=2))
    gateway = await start_gateway(keyed(single_backend_policy(dying.url)))
    received = []

    with pytest.raises(anthropic.APIStatusError) as caught:
        async with client(gateway).messages.stream(
                model="chat", max_tokens=64, messages=MESSAGES) as stream:
            async for piece in stream.text_stream:
                received.append(piece)

    assert len(received) == 2
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "mid-stream" in caught.value.body["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize(("extra", "param"), [
    ({"metadata": "user-1"}, "metadata"),
    ({"tools": ["search"]}, "tools.0"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": "http://x"}]}]},
     "messages.0.content.0"),
], ids=["metadata-string", "tool-string", "image-source-string"])
async def test_a_malformed_field_is_a_bad_request_naming_it(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, extra: dict[str, Any],
        param: str) -> None:
    gateway = await start_gateway(keyed(single_backend_policy(openai_upstream.url)))
    body = {"model": "chat", "max_tokens": 16, "messages": MESSAGES, **extra}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages", headers={"x-api-key": GATEWAY_KEY},
            json=body) as response:
        status, error = response.status, (await response.json())["error"]

    assert status == 400
    assert error["type"] == "invalid_request_error" and error["message"].startswith(param)
    assert openai_upstream.received == []


async def test_count_tokens_refuses_a_chunked_body_over_the_limit(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = keyed(single_backend_policy(openai_upstream.url, server={"max_body_bytes": 1000}))
    gateway = await start_gateway(policy)

    async def chunks() -> Any:  # no Content-Length: the limit applies while reading
        yield b'{"model": "chat", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}]}'

    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages/count_tokens", headers={"x-api-key": GATEWAY_KEY},
            data=chunks()) as response:
        status, error = response.status, (await response.json())["error"]

    assert status == 413 and error["type"] == "request_too_large"
