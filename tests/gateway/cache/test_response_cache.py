"""The response cache in the running gateway, with the official `openai` SDK as client."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from gateway.core.auth import key_hash
from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.limits.test_gateway_limits import ADMIN_HASH, ADMIN_KEY, usage
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.redis_server import RedisServer

MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]
PRICES = {"input_usd_per_mtok": 1000, "output_usd_per_mtok": 2000}


def cached_policy(url: str, *, cache: dict[str, Any] | None = None,
                  record_content: bool = False, **extra: Any) -> dict[str, Any]:
    """`chat` → one priced backend, with a response cache that may keep content."""
    policy = single_backend_policy(url, **extra)
    policy["backends"]["up"]["models"]["gpt-4o-mini"] = PRICES
    policy["routes"]["chat"]["cache"] = {"ttl_s": 60, "store_content": True, **(cache or {})}
    policy.setdefault("auth", {})["admin_keys"] = [ADMIN_HASH]
    if record_content:
        policy["compliance"] = {"record_content": True}
    return policy


async def ask(gateway: RunningGateway, api_key: str = "anonymous", **kwargs: Any,
              ) -> tuple[str, str, Any]:
    """(x-routegate-cache, Server-Timing, completion) of one chat request."""
    arguments = {"model": "chat", "messages": MESSAGES, "temperature": 0, **kwargs}
    raw = await gateway.openai(api_key).chat.completions.with_raw_response.create(**arguments)
    return raw.headers.get("x-routegate-cache"), raw.headers["Server-Timing"], raw.parse()


async def metrics(gateway: RunningGateway) -> str:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        return await response.text()


async def test_a_repeated_request_is_answered_from_the_cache_without_a_backend_call(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))

    first = await ask(gateway)
    second = await ask(gateway, user="someone-else", metadata={"k": "v"}, store=True)

    assert (first[0], second[0]) == ("miss", "hit")
    assert "cache;dur=" in second[1]
    assert second[2].model_dump() == first[2].model_dump()
    assert len(openai_upstream.received) == 1
    text = await metrics(gateway)
    assert 'routegate_cache_hits_total{route="chat"} 1.0' in text
    assert 'routegate_cache_misses_total{route="chat"} 1.0' in text
    saved = first[2].usage.prompt_tokens * 1000 + first[2].usage.completion_tokens * 2000
    assert f'routegate_cache_saved_micro_usd_total{{route="chat"}} {saved:.1f}' in text
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/dashboard/data",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        assert (await response.json())["cache"] == {"miss": 1, "hit": 1}


async def test_a_hit_is_admitted_as_a_request_and_charged_nothing(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(
        openai_upstream.url, defaults={"limits": {"requests_per_minute": 2}}))

    await ask(gateway)
    charged = (await usage(gateway.url))["day"]
    assert (await ask(gateway))[0] == "hit"

    day = (await usage(gateway.url))["day"]
    assert day["requests"] == 2
    assert (day["spend_micros"], day["total_tokens"]) == (charged["spend_micros"],
                                                          charged["total_tokens"])
    with pytest.raises(openai.RateLimitError):  # a hit still counts against the RPM
        await ask(gateway)


@pytest.mark.parametrize("include_usage", [False, True])
async def test_a_streamed_request_is_served_from_a_kept_whole_answer(
        include_usage: bool, openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))
    await ask(gateway)

    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, temperature=0, stream=True,
        stream_options={"include_usage": include_usage})
    chunks = [chunk async for chunk in stream]

    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == openai_upstream.behaviour.reply
    assert chunks[0].object == "chat.completion.chunk"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (chunks[-1].usage is not None) is include_usage
    assert len(openai_upstream.received) == 1


async def test_a_streamed_answer_is_kept_once_complete(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, temperature=0, stream=True)
    async for _ in stream:
        pass

    status, _, completion = await ask(gateway)

    assert status == "hit"
    assert completion.choices[0].message.content == openai_upstream.behaviour.reply
    assert completion.usage.completion_tokens == len(openai_upstream.behaviour.reply.split())


async def test_a_stream_cut_short_is_not_kept(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream(Behaviour(drop_after_chunks=2))
    gateway = await start_gateway(cached_policy(upstream.url))
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, temperature=0, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    upstream.behaviour.drop_after_chunks = None

    assert (await ask(gateway))[0] == "miss"


async def test_a_tenant_never_reads_another_tenants_answer_unless_the_route_is_global(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    tenants = {"acme": {"api_keys": [key_hash("sk-acme")]},
               "umbrella": {"api_keys": [key_hash("sk-umbrella")]}}
    auth = {"anonymous": {"enabled": False}}
    tenant_scoped = await start_gateway(cached_policy(
        openai_upstream.url, tenants=tenants, auth=auth))
    shared = await start_gateway(cached_policy(
        openai_upstream.url, cache={"scope": "global"}, tenants=tenants, auth=auth))

    await ask(tenant_scoped, "sk-acme")
    await ask(shared, "sk-acme")

    assert (await ask(tenant_scoped, "sk-umbrella"))[0] == "miss"
    assert (await ask(shared, "sk-umbrella"))[0] == "hit"


@pytest.mark.parametrize(("cache", "first", "second", "expected"), [
    ({}, {"temperature": 0.7}, {"temperature": 0.7}, "bypass"),
    # no temperature: the backend's default, which samples
    ({}, {"temperature": openai.NOT_GIVEN}, {"temperature": openai.NOT_GIVEN}, "bypass"),
    ({"nondeterministic": True}, {"temperature": 0.7}, {"temperature": 0.7}, "hit"),
    ({}, {}, {"max_tokens": 9}, "miss"),  # a sampling parameter is part of the key
])
async def test_which_requests_are_served_from_the_cache(
        cache: dict[str, Any], first: dict[str, Any], second: dict[str, Any], expected: str,
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url, cache=cache))
    await ask(gateway, **first)

    assert (await ask(gateway, **second))[0] == expected


@pytest.mark.parametrize(("headers", "expected", "calls"), [
    ({"Cache-Control": "no-store"}, "bypass", 2),
    ({"Cache-Control": "no-cache"}, "miss", 2),
    ({"x-routegate-cache-refresh": "1"}, "miss", 2),
])
async def test_cache_control_and_the_refresh_header_are_honoured(
        headers: dict[str, str], expected: str, calls: int,
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))
    await ask(gateway)

    status, _, _ = await ask(gateway, extra_headers=headers)

    assert (status, len(openai_upstream.received)) == (expected, calls)


async def test_no_store_keeps_nothing_and_refresh_replaces_the_entry(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))
    await ask(gateway, extra_headers={"Cache-Control": "no-store"})
    assert (await ask(gateway))[0] == "miss"

    openai_upstream.behaviour.reply = "A fresher answer."
    await ask(gateway, extra_headers={"x-routegate-cache-refresh": "1"})

    status, _, completion = await ask(gateway)
    assert (status, completion.choices[0].message.content) == ("hit", "A fresher answer.")


async def test_without_record_content_or_an_explicit_opt_in_nothing_is_cached(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url,
                                                cache={"store_content": False}))
    recorded = await start_gateway(cached_policy(
        openai_upstream.url, cache={"store_content": False}, record_content=True))

    await ask(gateway)
    await ask(recorded)

    assert (await ask(gateway))[0] == "bypass"
    assert (await ask(recorded))[0] == "hit"


@pytest.mark.parametrize("action", ["local_only", "redact"])
async def test_a_request_with_pii_kept_local_or_redacted_is_never_cached(
        action: str, openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = cached_policy(openai_upstream.url)
    policy["compliance"] = {"pii": {"detect": ["email"], "action": action}}
    policy["backends"]["up"]["deployment"] = "dedicated"  # local_only may use it
    gateway = await start_gateway(policy)
    messages = [{"role": "user", "content": "Mail ada@example.com the answer."}]

    await ask(gateway, messages=messages)

    assert (await ask(gateway, messages=messages))[0] == "bypass"
    assert len(openai_upstream.received) == 2


async def test_errors_and_answers_over_max_entry_bytes_are_never_kept(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=500, fail_times=1))
    gateway = await start_gateway(cached_policy(failing.url))
    with pytest.raises(openai.APIStatusError):
        await ask(gateway)
    assert (await ask(gateway))[0] == "miss"  # the error was not kept

    big = await start_upstream(Behaviour(reply="word " * 100))
    small_entries = await start_gateway(cached_policy(big.url, cache={"max_entry_bytes": 200}))
    await ask(small_entries)
    assert (await ask(small_entries))[0] == "miss"


async def test_a_redis_cache_is_shared_by_replicas_and_its_outage_is_no_cache(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    shared = {"response_cache": {"store": redis_server.url}}
    first = await start_gateway(cached_policy(openai_upstream.url, **shared))
    second = await start_gateway(cached_policy(openai_upstream.url, **shared))

    await ask(first)
    assert (await ask(second))[0] == "hit"

    redis_server.kill()
    status, _, completion = await ask(second)
    assert status == "bypass"
    assert completion.choices[0].message.content == openai_upstream.behaviour.reply
    assert 'routegate_cache_store_errors_total{route="chat"} 1.0' in await metrics(second)


async def test_a_responses_api_request_is_served_from_the_kept_chat_answer(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(cached_policy(openai_upstream.url))
    client = gateway.openai()
    first = await client.responses.with_raw_response.create(
        model="chat", input="Capital of France?", temperature=0)

    async with client.responses.stream(model="chat", input="Capital of France?",
                                       temperature=0) as stream:
        final = await stream.get_final_response()

    assert first.headers["x-routegate-cache"] == "miss"
    assert final.output_text == first.parse().output_text == openai_upstream.behaviour.reply
    assert len(openai_upstream.received) == 1


async def test_the_root_span_says_what_the_cache_did(
        openai_upstream: FakeOpenAI, start_traced: StartTraced,
        otlp_receiver: tuple[OtlpReceiver, str]) -> None:
    receiver, otlp_url = otlp_receiver
    traced = await start_traced(cached_policy(openai_upstream.url), otlp_url)
    await ask(traced.gateway)
    await ask(traced.gateway)
    await traced.flush()

    spans = await receiver.wait_for(lambda s: sum(x.kind == "SERVER" for x in s) == 2)

    roots = [span for span in spans if span.kind == "SERVER"]
    assert sorted(root.attributes["routegate.cache"] for root in roots) == ["hit", "miss"]
