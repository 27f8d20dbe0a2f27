"""What a client is told when its `model` is not served, and what such refusals cost it."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from gateway.settings import Settings
from tests.conftest import StartGateway, StartScripted, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

ONE_PER_MINUTE = {"limits": {"requests_per_minute": 1, "tokens_per_minute": 1_000_000}}
EVERY_NAME = {"allow": ["*"], "allow_targets": ["*"]}  # targets may be asked for directly


async def chat(url: str, model: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


def with_disabled_backend(url: str, **access: Any) -> dict[str, Any]:
    policy = single_backend_policy(url, defaults=access or EVERY_NAME)
    policy["backends"]["openai"] = {"type": "openai", "url": "https://api.openai.com/v1",
                                    "enabled": False, "models": {"gpt-4o": {}}}
    policy["routes"]["premium"] = {"targets": ["openai/gpt-4o"]}
    return policy


@pytest.mark.parametrize(("model", "suggestion"), [
    ("caht", "did you mean `chat`?"), ("up/gpt-4o-mni", "did you mean `up/gpt-4o-mini`?")])
async def test_an_unknown_model_is_a_404_with_the_closest_name(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, model: str,
        suggestion: str) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url,
                                                        defaults=EVERY_NAME))
    status, body = await chat(gateway.url, model)
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert body["error"]["param"] == "model"
    assert f"The model '{model}' does not exist; {suggestion}" in body["error"]["message"]


async def test_a_name_far_from_any_model_gets_no_suggestion(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url))
    _, body = await chat(gateway.url, "zzzzzz")
    assert "did you mean" not in body["error"]["message"]


@pytest.mark.parametrize(("model", "says"), [
    ("openai/gpt-4o", "its backend 'openai' is disabled"),
    ("premium", "every backend that serves it is disabled (openai)"),
])
async def test_a_model_that_exists_but_is_disabled_says_so(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway, model: str, says: str) -> None:
    gateway = await start_gateway(with_disabled_backend(openai_upstream.url))
    status, body = await chat(gateway.url, model)
    assert status == 404 and body["error"]["code"] == "model_disabled"
    assert says in body["error"]["message"] and "does not exist" not in body["error"]["message"]


async def test_a_request_no_started_backend_can_take_costs_no_requests_per_minute(
        start_gateway: StartGateway) -> None:
    policy = single_backend_policy("http://127.0.0.1:1/v1", defaults=ONE_PER_MINUTE)
    del policy["backends"]["up"]["url"]
    policy["backends"]["up"]["launch"] = {"model": "demo"}  # never started: supervise=False
    gateway = await start_gateway(policy, Settings(port=0, supervise=False))
    for _ in range(3):
        status, body = await chat(gateway.url, "chat")
        assert status == 503 and body["error"]["code"] == "no_backend_available", body
        assert "up/gpt-4o-mini" in body["error"]["message"]


async def test_requests_refused_as_invalid_or_unknown_cost_no_requests_per_minute(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url,
                                                        defaults=ONE_PER_MINUTE))
    assert (await chat(gateway.url, "missing"))[0] == 404
    assert (await chat(gateway.url, "chat", temperature="hot"))[0] == 400
    assert (await chat(gateway.url, "chat"))[0] == 200
    assert (await chat(gateway.url, "chat"))[0] == 429  # the one request it was allowed


async def test_a_disabled_or_unknown_name_the_caller_may_not_use_reads_as_unknown(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(with_disabled_backend(
        openai_upstream.url, allow=["chat"], allow_targets=[]))
    for model in ("premium", "openai/gpt-4o", "up/gpt-4o-mni"):
        status, body = await chat(gateway.url, model)
        assert status == 404 and body["error"]["code"] == "model_not_found", model
        assert "disabled" not in body["error"]["message"]
        assert "did you mean" not in body["error"]["message"]  # only `chat` is its to use


async def test_embeddings_on_a_chat_only_backend_name_the_model_and_the_endpoint(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    url = await scripted_upstream(never_chat)  # serves /v1/chat/completions only
    gateway = await start_gateway(single_backend_policy(url))
    with pytest.raises(openai.BadRequestError) as refused:
        await gateway.openai().embeddings.create(model="chat", input="hello")
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "unsupported_endpoint"
    assert "'chat'" in error["message"]
    assert "Backend 'up' has no /v1/embeddings endpoint" in error["message"]


async def test_embeddings_move_on_past_a_chat_only_backend_to_one_that_has_them(
        scripted_upstream: StartScripted, openai_upstream: FakeOpenAI,
        start_gateway: StartGateway) -> None:
    url = await scripted_upstream(never_chat)
    policy = single_backend_policy(url)
    policy["backends"]["embedder"] = {"type": "openai", "url": openai_upstream.url,
                                      "models": {"e": {}}}
    policy["routes"]["chat"]["targets"] = ["up/gpt-4o-mini", "embedder/e"]
    gateway = await start_gateway(policy)
    reply = await gateway.openai().embeddings.create(model="chat", input="hello")
    assert reply.data and gateway.url  # served by the second candidate


async def never_chat(request: web.Request) -> web.Response:
    raise AssertionError("only /v1/embeddings is asked for")
