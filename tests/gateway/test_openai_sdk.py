"""End to end with the official openai SDK as the client, a fake OpenAI upstream behind."""

from __future__ import annotations

import hashlib

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello"}]


async def test_chat_completion_is_relayed_with_the_backend_model_name(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    reply = await gateway.openai().chat.completions.create(model="chat", messages=MESSAGES)

    assert reply.choices[0].message.content == openai_upstream.behaviour.reply
    assert reply.usage is not None and reply.usage.completion_tokens == 9
    assert openai_upstream.received[-1].json["model"] == "gpt-4o-mini"
    assert openai_upstream.received[-1].json["messages"] == MESSAGES


async def test_a_target_can_be_named_directly_when_allowed(
        start_gateway: StartGateway, openai_upstream: FakeOpenAI) -> None:
    gateway = await start_gateway(single_backend_policy(
        openai_upstream.url, defaults={"allow_targets": ["up/*"]}))
    await gateway.openai().chat.completions.create(model="up/gpt-4o-mini", messages=MESSAGES)
    assert openai_upstream.received[-1].json["model"] == "gpt-4o-mini"


async def test_a_target_not_allowed_by_name_does_not_exist_for_the_caller(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await gateway.openai().chat.completions.create(model="up/gpt-4o-mini",
                                                       messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    assert openai_upstream.received == []


async def test_stream_with_include_usage_reports_usage_in_the_last_chunk(
        gateway: RunningGateway) -> None:
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == Behaviour().reply
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 11


async def test_stream_without_include_usage_hides_the_usage_chunk_the_gateway_asked_for(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]

    assert openai_upstream.received[-1].json["stream_options"] == {"include_usage": True}
    assert all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_completions_non_stream_and_stream(gateway: RunningGateway) -> None:
    client = gateway.openai()
    reply = await client.completions.create(model="chat", prompt="once upon a time")
    assert reply.choices[0].text == Behaviour().reply

    stream = await client.completions.create(model="chat", prompt="once", stream=True)
    text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    assert text == Behaviour().reply


async def test_embeddings_round_trip_through_base64(gateway: RunningGateway,
                                                    openai_upstream: FakeOpenAI) -> None:
    reply = await gateway.openai().embeddings.create(model="chat", input=["a b", "c"])

    assert [item.index for item in reply.data] == [0, 1]
    assert reply.data[1].embedding[:2] == pytest.approx([0.02, 0.04])
    assert reply.usage.prompt_tokens == 3
    assert openai_upstream.received[-1].path == "/v1/embeddings"


async def test_models_lists_routes_then_backend_models(
        start_gateway: StartGateway, openai_upstream: FakeOpenAI) -> None:
    gateway = await start_gateway(single_backend_policy(
        openai_upstream.url, defaults={"allow_targets": ["*"]}))
    models = await gateway.openai().models.list()
    ids = [model.id for model in models.data]
    assert ids == ["chat", "up/gpt-4o-mini"]
    assert models.data[1].owned_by == "up"


async def test_bad_request_raises_bad_request_error_naming_the_param(
        gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await gateway.openai().chat.completions.create(
            model="chat", messages=MESSAGES, temperature=7)
    assert raised.value.body["param"] == "temperature"  # type: ignore[index]


async def test_unknown_model_raises_not_found(gateway: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        await gateway.openai().chat.completions.create(model="nope", messages=MESSAGES)
    assert raised.value.code == "model_not_found"


async def test_wrong_key_raises_authentication_error(openai_upstream: FakeOpenAI,
                                                     start_gateway: StartGateway) -> None:
    key_hash = "sha256:" + hashlib.sha256(b"right-key").hexdigest()
    policy = single_backend_policy(openai_upstream.url, tenants={"acme": {"api_keys": [key_hash]}},
                                   auth={})
    gateway = await start_gateway(policy)

    with pytest.raises(openai.AuthenticationError):
        await gateway.openai(api_key="wrong-key").chat.completions.create(
            model="chat", messages=MESSAGES)
    reply = await gateway.openai(api_key="right-key").chat.completions.create(
        model="chat", messages=MESSAGES)
    assert reply.choices[0].message.content


async def test_rate_limited_on_every_candidate_raises_rate_limit_error(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first = await start_upstream(Behaviour(status=429, retry_after="7"), name="first")
    second = await start_upstream(Behaviour(status=429, retry_after="3"), name="second")
    policy = {
        "version": 1,
        "backends": {"a": {"type": "openai", "url": first.url, "models": {"m": {}}},
                     "b": {"type": "openai", "url": second.url, "models": {"m": {}}}},
        "routes": {"chat": {"targets": ["a/m", "b/m"]}},
        "auth": {"anonymous": {"enabled": True}},
    }
    gateway = await start_gateway(policy)

    with pytest.raises(openai.RateLimitError) as raised:
        await gateway.openai().chat.completions.create(model="chat", messages=MESSAGES)
    assert raised.value.response.headers["Retry-After"] == "3"
    assert "'a'" in raised.value.message and "'b'" in raised.value.message
    assert len(first.received) == len(second.received) == 1


async def test_body_sent_upstream_is_the_clients_bytes_with_only_model_changed(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    raw = b'{ "messages": [{"role":"user","content":"hi"}],\n "model" : "chat", "x_custom": 1.50}'
    async with gateway.openai()._client.stream(  # raw bytes: the SDK would re-encode
            "POST", gateway.base_url + "/chat/completions", content=raw,
            headers={"Content-Type": "application/json"}) as response:
        await response.aread()

    assert response.status_code == 200
    assert openai_upstream.received[-1].raw == raw.replace(b'"chat"', b'"gpt-4o-mini"')
    assert orjson.loads(response.content)["model"] == "gpt-4o-mini"
