"""A Messages request to an Anthropic backend goes as the client wrote it: fields the chat
translation has no room for (`thinking`, `cache_control`, `metadata`, `top_k`) reach the
backend, what it answers (thinking blocks included) reaches the client, and its usage
is still what limits and the ledger count."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tests.conftest import RunningGateway, StartGateway
from tests.fakes.anthropic_upstream import (
    SIGNATURE,
    THINKING,
    AnthropicBehaviour,
    FakeAnthropic,
)
from tests.gateway.anthropic.conftest import MODEL, StartAnthropic, anthropic_policy
from tests.gateway.limits.test_gateway_limits import ADMIN_HASH, usage

UPSTREAM_MODEL = MODEL + "-20251001"
# as a client would write it: compact, its own field order, fields chat has no word for
REQUEST = (b'{"model":"chat","max_tokens":2048,'
           b'"thinking":{"type":"enabled","budget_tokens":1024},'
           b'"system":[{"type":"text","text":"Be brief.",'
           b'"cache_control":{"type":"ephemeral","ttl":"1h"}}],'
           b'"metadata":{"user_id":"u-42"},"top_k":5,'
           b'"messages":[{"role":"user","content":[{"type":"text","text":"Say hello.",'
           b'"cache_control":{"type":"ephemeral"}}]}]}')
LONG_REPLY = " ".join(f"w{n}" for n in range(150))


def client(gateway: RunningGateway) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key="anonymous", max_retries=0)


def priced(url: str, **extra: Any) -> dict[str, Any]:
    """The Anthropic backend at $1/$2 per million tokens, with an admin key for
    /admin/usage."""
    policy = anthropic_policy(url, **extra)
    policy["backends"]["claude"]["models"][MODEL].update(
        {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0})
    policy["auth"] = {"anonymous": {"enabled": True, "loopback_only": True},
                      "admin_keys": [ADMIN_HASH]}
    return policy


async def post(gateway: RunningGateway, body: bytes,
               **headers: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/messages", data=body,
            headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01",
                     **headers}) as response:
        return response.status, await response.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_reaches_the_backend_as_written_with_only_the_model_changed(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway, stream: bool) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))
    body = REQUEST if not stream else REQUEST[:-1] + b',"stream":true}'

    status, _ = await post(gateway, body)

    assert status == 200
    assert anthropic_upstream.received[-1].raw == body.replace(
        b'"model":"chat"', b'"model":"' + UPSTREAM_MODEL.encode() + b'"')


async def test_the_beta_features_the_client_asked_for_are_asked_for_too(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    status, _ = await post(gateway, REQUEST, **{"anthropic-beta": "extended-cache-ttl-2025-04-11"})

    assert status == 200
    assert anthropic_upstream.received[-1].headers["anthropic-beta"] == \
        "extended-cache-ttl-2025-04-11"


async def test_the_backends_thinking_block_reaches_the_client(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    async with client(gateway) as sdk:
        reply = await sdk.messages.create(
            model="chat", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "Say hello."}])

    thinking, text = reply.content
    assert thinking.type == "thinking" and thinking.thinking == THINKING
    assert thinking.signature == SIGNATURE  # what the next turn must send back
    assert text.type == "text" and text.text == anthropic_upstream.behaviour.reply
    assert reply.model == UPSTREAM_MODEL


async def test_a_streamed_answer_passes_through_event_for_event(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(anthropic_policy(anthropic_upstream.url))

    async with client(gateway) as sdk, sdk.messages.stream(
            model="chat", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "Say hello."}]) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()

    assert kinds.count("thinking") == 1 and kinds.count("signature") == 1
    assert final.content[0].type == "thinking" and final.content[0].signature == SIGNATURE
    assert final.content[1].type == "text"
    assert final.content[1].text == anthropic_upstream.behaviour.reply
    # message_start's input tokens, message_delta's output tokens
    assert final.usage.input_tokens == 2
    assert final.usage.output_tokens == len(anthropic_upstream.behaviour.reply.split())


@pytest.mark.parametrize("stream", [False, True])
async def test_the_ledger_charges_the_usage_the_backend_reported(
        start_anthropic: StartAnthropic, start_gateway: StartGateway, stream: bool) -> None:
    fake = await start_anthropic(AnthropicBehaviour(reply="one two three"))
    gateway = await start_gateway(priced(fake.url))
    body: dict[str, Any] = {"model": "chat", "max_tokens": 64, "stream": stream,
                            "messages": [{"role": "user", "content": "hi there"}]}

    status, _ = await post(gateway, orjson.dumps(body))

    assert status == 200
    day = (await usage(gateway.url))["day"]
    # the fake counts words: 2 in, 3 out
    assert (day["requests"], day["input_tokens"], day["output_tokens"]) == (1, 2, 3)
    assert day["spend_micros"] == 2 * 1 + 3 * 2


@pytest.mark.parametrize("stream", [False, True])
async def test_tokens_per_minute_count_the_usage_the_backend_reported(
        start_anthropic: StartAnthropic, start_gateway: StartGateway, stream: bool) -> None:
    # 150 words answered to a request that reserved 16 output tokens: only the reported
    # usage puts the tenant over its 150 tokens a minute
    fake = await start_anthropic(AnthropicBehaviour(reply=LONG_REPLY))
    gateway = await start_gateway(priced(fake.url, defaults={"limits": {
        "requests_per_minute": 100, "tokens_per_minute": 150}}))
    body = orjson.dumps({"model": "chat", "max_tokens": 16, "stream": stream,
                         "messages": [{"role": "user", "content": "hi"}]})

    first, _ = await post(gateway, body)
    second, answer = await post(gateway, body)

    assert first == 200
    assert second == 429
    error = orjson.loads(answer)
    assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"


async def test_a_backends_refusal_reaches_the_client_in_anthropics_shape(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    fake = await start_anthropic(AnthropicBehaviour(status=400))
    gateway = await start_gateway(anthropic_policy(fake.url))

    async with client(gateway) as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(
                model="chat", max_tokens=64, messages=[{"role": "user", "content": "hi"}])

    assert refused.value.status_code == 400
    assert refused.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "fake fails with 400"}}


async def test_an_overloaded_backend_is_an_anthropic_error_for_the_client(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    fake = await start_anthropic(AnthropicBehaviour(status=529))
    gateway = await start_gateway(anthropic_policy(fake.url))

    async with client(gateway) as sdk:
        with pytest.raises(anthropic.APIStatusError) as failed:
            await sdk.messages.create(
                model="chat", max_tokens=64, messages=[{"role": "user", "content": "hi"}])

    body = failed.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert "claude" in body["error"]["message"]  # names the backend that failed


async def test_an_error_event_mid_stream_reaches_the_client_as_the_backend_sent_it(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    fake = await start_anthropic(AnthropicBehaviour(error_after_deltas=2))
    gateway = await start_gateway(anthropic_policy(fake.url))
    body = orjson.dumps({"model": "chat", "max_tokens": 64, "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})

    status, answer = await post(gateway, body)

    assert status == 200
    events = [event for event in answer.split(b"\n\n") if event.startswith(b"event:")]
    assert events[-1].startswith(b"event: error\ndata: ")
    assert orjson.loads(events[-1].split(b"data: ", 1)[1])["error"]["type"] == "overloaded_error"
    assert sum(event.startswith(b"event: error") for event in events) == 1  # and no other


async def test_a_redacted_request_goes_translated_never_as_the_client_wrote_it(
        anthropic_upstream: FakeAnthropic, start_gateway: StartGateway) -> None:
    policy = anthropic_policy(anthropic_upstream.url, compliance={
        "pii": {"detect": ["email"], "action": "redact"}})
    gateway = await start_gateway(policy)
    body = orjson.dumps({"model": "chat", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Write to jane.doe@example.com please."}]})

    status, _ = await post(gateway, body)

    assert status == 200
    assert b"jane.doe@example.com" not in anthropic_upstream.received[-1].raw
