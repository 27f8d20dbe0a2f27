"""The official `openai` SDK's `client.responses` → the gateway's `/v1/responses` →
a chat-only backend (translated) or a backend that speaks the Responses API (native)."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from gateway.core.auth import key_hash
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.anthropic.conftest import StartAnthropic, anthropic_policy
from tests.gateway.responses.conftest import WEATHER_TOOL, responses_policy

Backends = tuple[FakeOpenAI, FakeResponses]


@pytest.fixture
async def backends(start_upstream: StartUpstream,
                   native_upstream: FakeResponses) -> Backends:
    chat = await start_upstream(Behaviour(tool_call=("get_weather", '{"city": "Paris"}')))
    return chat, native_upstream


def policy_for(kind: str, backends: Backends, **extra: Any) -> dict[str, Any]:
    chat, native = backends
    if kind == "native":
        return responses_policy(native_url=native.url, **extra)
    return responses_policy(chat_url=chat.url, **extra)


def reply_of(kind: str, backends: Backends) -> str:
    return backends[1].reply if kind == "native" else backends[0].behaviour.reply


@pytest.mark.parametrize("kind", ["chat", "native"])
async def test_a_response_is_created_through_either_kind_of_backend(
        kind: str, backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for(kind, backends))

    response = await gateway.openai().responses.create(
        model="chat", input="Say hello.", instructions="Be brief.", max_output_tokens=64,
        temperature=0.2)

    assert response.object == "response" and response.status == "completed"
    assert response.output_text == reply_of(kind, backends)
    assert response.usage is not None and response.usage.output_tokens > 0
    if kind == "chat":
        sent = backends[0].received[-1].json
        assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Say hello."}]
        assert (sent["max_tokens"], sent["temperature"], sent["model"]) == (64, 0.2, "llama")
    else:  # the request as the client wrote it, to the backend's own /responses
        sent = backends[1].received[-1]
        assert (sent["input"], sent["instructions"]) == ("Say hello.", "Be brief.")
        assert (sent["max_output_tokens"], sent["model"]) == (64, "gpt-5")


@pytest.mark.parametrize("kind", ["chat", "native"])
async def test_a_streamed_response_arrives_as_the_sdk_parses_it(
        kind: str, backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for(kind, backends))

    async with gateway.openai().responses.stream(model="chat", input="Say hello.") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()

    kinds = [event.type for event in events]
    assert (kinds[0], kinds[-1]) == ("response.created", "response.completed")
    deltas = "".join(event.delta for event in events
                     if event.type == "response.output_text.delta")
    assert deltas == final.output_text == reply_of(kind, backends)
    assert final.usage is not None and final.usage.output_tokens > 0
    if kind == "chat":
        numbers = [event.sequence_number for event in events]
        assert numbers == list(range(len(events)))


@pytest.mark.parametrize("kind", ["chat", "native"])
async def test_a_second_turn_continues_from_previous_response_id(
        kind: str, backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for(kind, backends))
    client = gateway.openai()

    first = await client.responses.create(model="chat", input="My name is Ada.")
    second = await client.responses.create(model="chat", input="What is my name?",
                                           previous_response_id=first.id)

    assert second.previous_response_id == first.id
    if kind == "chat":
        assert backends[0].received[-1].json["messages"] == [
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": reply_of(kind, backends)},
            {"role": "user", "content": "What is my name?"}]
    else:  # the gateway's store holds the conversation: the backend gets all of it
        sent = backends[1].received[-1]
        assert "previous_response_id" not in sent
        assert [item.get("role") for item in sent["input"]] == ["user", "assistant", "user"]
        assert sent["input"][1]["content"][0]["text"] == reply_of(kind, backends)


@pytest.mark.parametrize("kind", ["chat", "native"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_function_tool_round_trip(kind: str, streamed: bool, backends: Backends,
                                          start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for(kind, backends))
    client = gateway.openai()

    if streamed:
        async with client.responses.stream(model="chat", input="Weather in Paris?",
                                           tools=[WEATHER_TOOL]) as stream:
            first = await stream.get_final_response()
    else:
        first = await client.responses.create(model="chat", input="Weather in Paris?",
                                              tools=[WEATHER_TOOL], tool_choice="auto")
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert orjson.loads(call.arguments) == {"city": "Paris"}

    second = await client.responses.create(
        model="chat", previous_response_id=first.id, tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "Sunny, 21 °C"}])

    assert second.output_text == reply_of(kind, backends)
    if kind == "chat":
        sent = backends[0].received[-1].json
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        assert sent["messages"][-2]["tool_calls"][0]["id"] == call.call_id
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id,
                                        "content": "Sunny, 21 °C"}
    else:
        items = backends[1].received[-1]["input"]
        assert [item["type"] for item in items[-2:]] == ["function_call",
                                                         "function_call_output"]


async def test_a_stored_response_can_be_read_and_deleted(
        backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for("chat", backends))
    client = gateway.openai()
    created = await client.responses.create(model="chat", input="Hi.")

    assert (await client.responses.retrieve(created.id)).output_text == created.output_text
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)


async def test_a_response_created_with_store_false_is_not_kept(
        backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for("chat", backends))
    client = gateway.openai()
    created = await client.responses.create(model="chat", input="Hi.", store=False)

    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as refused:
        await client.responses.create(model="chat", input="Again.",
                                      previous_response_id=created.id)
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_a_tenant_never_reads_another_tenants_response(
        backends: Backends, start_gateway: StartGateway) -> None:
    tenants = {"acme": {"api_keys": [key_hash("sk-acme")]},
               "umbrella": {"api_keys": [key_hash("sk-umbrella")]}}
    gateway = await start_gateway(policy_for(
        "chat", backends, tenants=tenants, auth={"anonymous": {"enabled": False}}))
    created = await gateway.openai("sk-acme").responses.create(model="chat", input="Hi.")

    other = gateway.openai("sk-umbrella")
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.create(model="chat", input="Hi.",
                                     previous_response_id=created.id)


async def test_a_field_chat_cannot_carry_is_a_400_naming_it(
        backends: Backends, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(policy_for("chat", backends))

    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.openai().responses.create(
            model="chat", input="Search the web.", tools=[{"type": "web_search"}])

    assert refused.value.body["param"] == "tools[0].type"  # type: ignore[index]
    assert backends[0].received == []


async def test_a_native_backend_takes_what_chat_cannot(
        backends: Backends, start_gateway: StartGateway) -> None:
    chat, native = backends
    gateway = await start_gateway(responses_policy(native_url=native.url, chat_url=chat.url))

    response = await gateway.openai().responses.create(
        model="chat", input="Search the web.", tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"])

    assert response.output_text == native.reply
    assert native.received[-1]["tools"] == [{"type": "web_search"}]


async def test_a_conversation_continues_on_another_replica_through_redis(
        backends: Backends, start_gateway: StartGateway, redis_server: Any) -> None:
    state = {"responses": {"store": redis_server.url, "ttl_s": 60}}
    first_replica = await start_gateway(policy_for("chat", backends, **state))
    second_replica = await start_gateway(policy_for("chat", backends, **state))

    first = await first_replica.openai().responses.create(model="chat", input="I am Ada.")
    second = await second_replica.openai().responses.create(
        model="chat", input="Who am I?", previous_response_id=first.id)

    assert second.status == "completed"
    assert backends[0].received[-1].json["messages"][0] == {"role": "user",
                                                            "content": "I am Ada."}


async def test_a_response_is_served_by_an_anthropic_backend(
        start_anthropic: StartAnthropic, start_gateway: StartGateway) -> None:
    anthropic = await start_anthropic()
    gateway = await start_gateway(anthropic_policy(anthropic.url))

    async with gateway.openai().responses.stream(
            model="chat", input="Say hello.", instructions="Be brief.",
            max_output_tokens=64) as stream:
        final = await stream.get_final_response()

    assert final.output_text == "Hello from the fake Anthropic upstream."
    sent = anthropic.received[-1].json
    assert (sent["system"], sent["max_tokens"]) == ("Be brief.", 64)
