"""The OpenAI SDK → gateway → a `type: anthropic` backend (the Messages API)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.settings import Settings
from policies.load import load
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.anthropic_upstream import AnthropicBehaviour, FakeAnthropic
from tests.gateway.anthropic.conftest import MODEL, UPSTREAM_KEY, StartAnthropic, anthropic_policy

DEFAULT_POLICY = Path(__file__).parents[3] / "policies" / "default.yaml"
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello to the fake."}]


async def test_chat_completion_is_answered_by_the_messages_api(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=50)

    assert reply.choices[0].message.content == "Hello from the fake Anthropic upstream."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == MODEL + "-20251001"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 6)
    assert reply.usage.total_tokens == 13


async def test_the_backend_receives_a_messages_request_with_its_key_and_version(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, temperature=0.5, stop="END")

    sent = anthropic_upstream.received[-1]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == UPSTREAM_KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in sent.headers
    assert sent.json == {"model": MODEL + "-20251001", "max_tokens": 4096,
                         "messages": [{"role": "user", "content": [
                             {"type": "text", "text": "Say hello to the fake."}]}],
                         "system": "Be brief.", "temperature": 0.5, "stop_sequences": ["END"]}


async def test_max_tokens_reached_is_finish_reason_length(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    fake = await start_anthropic(AnthropicBehaviour(stop_reason="max_tokens"))
    gateway = await start_gateway(anthropic_policy(fake.url))

    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, max_completion_tokens=3)

    assert reply.choices[0].finish_reason == "length"
    assert fake.received[-1].json["max_tokens"] == 3


async def test_streamed_chat_arrives_as_chunks_with_usage(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the fake Anthropic upstream."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 7 and chunks[-1].usage.completion_tokens == 6
    assert anthropic_upstream.received[-1].json["stream"] is True


async def test_streamed_chat_without_include_usage_has_no_usage_chunk(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, "stream": True}) as response:
        raw = await response.read()

    assert b'"usage"' not in raw
    assert raw.endswith(b"data: [DONE]\n\n")
    assert raw.count(b'"delta":{"content":"') == 6  # one per text delta


async def test_an_overloaded_anthropic_backend_falls_back_to_the_openai_one(
        start_anthropic: StartAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=529))
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(claude.url, gpt.url))

    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES)

    assert reply.choices[0].message.content == gpt.behaviour.reply
    assert len(claude.received) == 1 and len(gpt.received) == 1


async def test_a_streamed_request_also_falls_back_from_529(
        start_anthropic: StartAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=529))
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(claude.url, gpt.url))

    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert text == gpt.behaviour.reply and len(claude.received) == 1


async def test_only_an_overloaded_backend_is_a_502_with_its_message(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=529))
    gateway = await start_gateway(anthropic_policy(claude.url))

    with pytest.raises(openai.InternalServerError) as caught:
        await gateway.openai().chat.completions.create(
            model="chat", messages=MESSAGES)

    assert caught.value.status_code == 502
    assert "HTTP 529" in caught.value.message and "Overloaded" in caught.value.message


async def test_a_rate_limited_backend_is_a_429_with_its_retry_after(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(status=429, retry_after="7"))
    gateway = await start_gateway(anthropic_policy(claude.url))

    with pytest.raises(openai.RateLimitError) as caught:
        await gateway.openai().chat.completions.create(
            model="chat", messages=MESSAGES)

    assert caught.value.response.headers["Retry-After"] == "7"


async def test_a_backend_refusing_the_gateways_key_is_a_502_naming_it_not_the_clients_401(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    policy = anthropic_policy(anthropic_upstream.url)
    policy["backends"]["claude"]["api_key"] = "sk-ant-wrong"
    gateway = await start_gateway(policy)

    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.openai().chat.completions.create(
            model="chat", messages=MESSAGES)

    assert caught.value.status_code == 502
    message = caught.value.body["message"]
    assert "'claude'" in message and "credentials (HTTP 401)" in message
    assert "invalid x-api-key" in message  # what the backend said


async def test_an_error_event_mid_stream_ends_the_stream_with_an_error(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    # the delay puts the deltas in reads of their own, after the stream has begun
    claude = await start_anthropic(AnthropicBehaviour(error_after_deltas=2, chunk_delay_s=0.02))
    gateway = await start_gateway(anthropic_policy(claude.url))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, "stream": True}) as response:
        raw = await response.read()

    assert raw.count(b'"delta":{"content":"') == 2
    assert b'"error":{"message":"Overloaded","type":"server_error","code":"overloaded"' in raw
    assert b"[DONE]" not in raw


async def test_tool_calls_come_back_as_openai_tool_calls(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    claude = await start_anthropic(AnthropicBehaviour(tool_call=("weather", {"city": "Oslo"})))
    gateway = await start_gateway(anthropic_policy(claude.url))
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]

    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, tools=tools)
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, tools=tools, stream=True)
    chunks = [chunk async for chunk in stream]

    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, call.function.arguments) == ("weather", '{"city":"Oslo"}')
    assert reply.choices[0].finish_reason == "tool_calls"
    streamed = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                       for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    assert streamed == '{"city":"Oslo"}'
    assert claude.received[-1].json["tools"][0]["input_schema"]["properties"] == {
        "city": {"type": "string"}}


@pytest.mark.parametrize("path, body", [
    ("/embeddings", {"model": "chat", "input": "hi"}),
    ("/completions", {"model": "chat", "prompt": "hi"}),
])
async def test_endpoints_without_a_messages_counterpart_are_a_clear_400(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway,
        path: str, body: dict[str, str]) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + path, json=body) as response:
        status, error = response.status, (await response.json())["error"]

    assert status == 400
    assert error["message"].startswith("Backend 'claude' is an Anthropic backend and does "
                                       f"not support /v1{path}")
    assert anthropic_upstream.received == []


async def test_embeddings_on_a_mixed_route_go_to_the_openai_backend(
        anthropic_upstream: FakeAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url, gpt.url))

    result = await gateway.openai().embeddings.create(model="chat", input="hi")

    assert len(result.data) == 1 and gpt.received[-1].path == "/v1/embeddings"
    assert anthropic_upstream.received == []


async def test_readyz_counts_an_anthropic_backend_as_ready(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/readyz") as response:
        assert response.status == 200
        assert (await response.json())["backends"] == {"claude": "ready"}


async def test_the_default_policys_anthropic_backend_works_once_its_key_is_set(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    policy = load(DEFAULT_POLICY, environ={"ANTHROPIC_API_KEY": UPSTREAM_KEY,
                                           "ANTHROPIC_BASE_URL": anthropic_upstream.url})
    gateway = await start_gateway(policy, Settings(port=0, supervise=False))

    reply = await gateway.openai().chat.completions.create(
        model="anthropic/claude-haiku-4-5", messages=MESSAGES)

    assert reply.choices[0].message.content == "Hello from the fake Anthropic upstream."
    assert anthropic_upstream.received[-1].json["model"] == "claude-haiku-4-5"


@pytest.mark.parametrize("extra", [
    {"tools": ["search"]},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": None, "tool_calls": ["call"]}]},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function", "function": "f"}]}]},
], ids=["tool-string", "tool-call-string", "tool-call-function-string"])
async def test_a_malformed_tool_field_is_a_400_not_a_500(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway,
        extra: dict[str, object]) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    body = {"model": "chat", "messages": MESSAGES, **extra}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=body) as response:
        status, error = response.status, (await response.json())["error"]

    assert status == 400 and error["type"] == "invalid_request_error"
    assert anthropic_upstream.received == []


async def test_a_request_an_anthropic_backend_cannot_express_goes_to_the_next_candidate(
        anthropic_upstream: FakeAnthropic, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    gpt = await start_upstream()
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url, gpt.url))
    body = {"model": "chat", "messages": MESSAGES, "n": 2}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=body) as response:
        status, route = response.status, response.headers["x-routegate-route"]

    assert status == 200 and route == "gpt/gpt-4o-mini"
    assert anthropic_upstream.received == [] and gpt.received[-1].json["n"] == 2


async def test_a_request_no_candidate_can_express_is_a_400_naming_the_field(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    body = {"model": "chat", "messages": MESSAGES, "n": 2}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=body) as response:
        status, error = response.status, (await response.json())["error"]

    assert status == 400 and error["param"] == "n"
    assert anthropic_upstream.received == []
