"""The OpenAI surface, spoken to by the openai SDK and by plain HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from local_backend.server.errors import ApiError
from local_backend.server.protocol import parse
from tests.local_backend import reference
from tests.local_backend.server.conftest import ServeFactory

CHAT = [{"role": "user", "content": "Say something."}]


async def test_chat_streams_through_the_openai_sdk_with_usage_and_metrics(
    serve: ServeFactory,
) -> None:
    served = await serve()
    stream = await served.client().chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, temperature=0, extra_body={"ignore_eos": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    finish = [f for f in finish if f]
    assert finish == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12
    metrics = last.model_extra["metrics"]
    assert metrics["completion_tokens"] == 12
    assert metrics["prompt_tokens"] == last.usage.prompt_tokens
    non_stream = await served.client().chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
    )
    assert non_stream.choices[0].message.content == text


async def test_completion_with_token_ids_matches_the_reference(
    serve: ServeFactory, tiny_state: dict, tiny_config: object
) -> None:
    served = await serve()
    ids = [256, 10, 20, 30, 40, 50, 60, 70]
    result = await served.client().completions.create(
        model="tiny", prompt=ids, max_tokens=8, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True},
    )
    tokens = reference.greedy(tiny_state, tiny_config, ids, 8)  # type: ignore[arg-type]
    assert result.choices[0].logprobs is not None
    expected = [served.engine.tokenizer.decode([t]) for t in tokens]
    assert result.choices[0].logprobs.tokens == expected


def parse_server_timing(header: str) -> dict[str, float]:
    parts = (p.strip().split(";dur=") for p in header.split(","))
    return {name: float(value) for name, value in parts}


async def test_non_stream_response_carries_metrics_and_server_timing(serve: ServeFactory) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.post(
        served.url + "/completions",
        json={"model": "tiny", "prompt": "hello", "max_tokens": 6, "ignore_eos": True},
    ) as resp:
        assert resp.status == 200
        body = await resp.json()
        header = parse_server_timing(resp.headers["Server-Timing"])
    m = body["metrics"]
    assert set(m) == {"queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "inference_ms",
                      "server_total_ms", "prompt_tokens", "cached_tokens", "completion_tokens",
                      "preemptions"}
    assert header == {"queue": m["queue_ms"], "prefill": m["prefill_ms"], "ttft": m["ttft_ms"],
                      "decode": m["decode_ms"], "inference": m["inference_ms"],
                      "total": m["server_total_ms"]}
    assert body["usage"]["completion_tokens"] == m["completion_tokens"] == 6


async def test_timings_obey_the_contract_under_load(serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=3)
    client = served.client()

    async def one(i: int) -> dict:
        stream = await client.completions.create(
            model="tiny", prompt=f"request {i}", max_tokens=8, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
        return chunks[-1].model_extra["metrics"]

    for m in await asyncio.gather(*(one(i) for i in range(8))):
        assert m["queue_ms"] >= 0 and m["prefill_ms"] >= 0 and m["decode_ms"] >= 0
        assert abs(m["prefill_ms"] + m["decode_ms"] - m["inference_ms"]) <= 1
        assert abs(m["queue_ms"] + m["prefill_ms"] - m["ttft_ms"]) <= 1
        assert m["server_total_ms"] >= m["queue_ms"] + m["inference_ms"] - 1
        assert m["completion_tokens"] == 8 and m["preemptions"] == 0


@pytest.mark.parametrize("n", [1, 3])
async def test_client_disconnect_aborts_the_request_and_frees_its_blocks(
    serve: ServeFactory, n: int,
) -> None:
    served = await serve(num_blocks=256)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(served.url + "/completions", json={
            "prompt": "a long one", "max_tokens": 400, "n": n, "stream": True,
            "ignore_eos": True})
        await resp.content.readline()  # the first token is out: the request holds blocks
        assert served.engine.blocks.num_free < served.engine.blocks.num_blocks
        resp.close()
    for _ in range(400):
        if served.engine.stats().aborted == n:  # every choice
            break
        await asyncio.sleep(0.005)
    assert served.engine.stats().aborted == n
    assert served.engine.blocks.num_free == served.engine.blocks.num_blocks


async def test_full_waiting_queue_answers_429_with_retry_after(serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=1, max_waiting=1, num_blocks=256)
    engine = served.engine
    async with aiohttp.ClientSession() as http:
        running = await http.post(served.url + "/completions", json={
            "prompt": "first", "max_tokens": 400, "stream": True, "ignore_eos": True})
        await running.content.readline()
        waiting = asyncio.ensure_future(http.post(served.url + "/completions", json={
            "prompt": "second", "max_tokens": 2}))
        for _ in range(1000):  # the engine thread owns this count; poll it
            if engine.stats().waiting >= 1:
                break
            await asyncio.sleep(0.002)
        async with http.post(served.url + "/completions",
                             json={"prompt": "third", "max_tokens": 2}) as rejected:
            assert rejected.status == 429
            assert rejected.headers["Retry-After"] == "1"
            assert (await rejected.json())["error"]["type"] == "rate_limit_error"
        running.close()
        (await waiting).close()


async def test_unknown_model_is_an_openai_shaped_404(serve: ServeFactory) -> None:
    served = await serve()
    with pytest.raises(Exception) as caught:
        await served.client().chat.completions.create(model="nope", messages=CHAT)
    assert getattr(caught.value, "status_code", None) == 404
    assert "nope" in str(caught.value)


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": CHAT, "temperature": 9},
    {"messages": CHAT, "n": 17},  # more choices than the server generates at once
    {"messages": CHAT, "max_tokens": 0},
    {"messages": CHAT, "stop": 5},
    {"messages": CHAT, "stop": {"a": 1}},
    {"messages": CHAT, "logprobs": True, "top_logprobs": 21},
    {"messages": CHAT, "top_logprobs": 2},  # without logprobs: true it would do nothing
    {"messages": CHAT, "stream": "false"},  # a string, which bool() would read as true
    {"messages": CHAT, "logprobs": 1},
    {"messages": [{"role": "user", "content": [  # text-only models: refused, not dropped
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
])
async def test_bad_request_is_an_openai_shaped_400(serve: ServeFactory, body: dict) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.post(
        served.url + "/chat/completions", json=body
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error" and error["message"]


async def test_models_and_health(serve: ServeFactory) -> None:
    served = await serve()
    models = await served.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    async with aiohttp.ClientSession() as http, http.get(
        str(served.server.make_url("/health"))
    ) as resp:
        assert resp.status == 200 and await resp.json() == {"status": "ok"}



async def test_non_stream_client_that_goes_away_aborts_its_request(serve: ServeFactory) -> None:
    served = await serve(num_blocks=256)
    engine = served.engine
    async with aiohttp.ClientSession() as http:
        request = asyncio.ensure_future(http.post(served.url + "/completions", json={
            "prompt": "a long one", "max_tokens": 400, "ignore_eos": True}))
        for _ in range(1000):
            if engine.stats().running == 1:
                break
            await asyncio.sleep(0.002)
        request.cancel()  # closes the connection mid-request
        with pytest.raises(asyncio.CancelledError):
            await request
    for _ in range(400):
        if engine.stats().aborted == 1:
            break
        await asyncio.sleep(0.005)
    assert engine.stats().aborted == 1
    assert engine.blocks.num_free == engine.blocks.num_blocks


async def test_chat_logprobs_list_the_chosen_token_and_alternatives(serve: ServeFactory) -> None:
    served = await serve()
    result = await served.client().chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    logprobs = result.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 3
    for entry in logprobs.content:
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy = top-1


async def test_prompt_beyond_the_context_is_a_400_naming_the_limit(serve: ServeFactory) -> None:
    served = await serve(num_blocks=8)  # 7 usable blocks of 4 tokens: a 28-token context
    async with aiohttp.ClientSession() as http, http.post(
        served.url + "/completions", json={"prompt": "x" * 40, "max_tokens": 2}
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "context_length_exceeded" and "28 tokens" in error["message"]


async def test_completion_asking_for_more_logprobs_than_offered_is_a_400(
    serve: ServeFactory,
) -> None:
    served = await serve()
    async with aiohttp.ClientSession() as http, http.post(
        served.url + "/completions", json={"prompt": "hi", "max_tokens": 1, "logprobs": 21}
    ) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "logprobs"


async def test_logit_bias_reaches_the_sampler_and_its_ids_are_checked(serve: ServeFactory) -> None:
    served = await serve()
    body = {"prompt": "hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(served.url + "/completions",
                             json={**body, "logit_bias": {"65": 100}}) as resp:
            assert (await resp.json())["choices"][0]["text"] == "AAA"  # byte 65 forced
        async with http.post(served.url + "/completions",
                             json={**body, "logit_bias": {"260": 1}}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["param"] == "logit_bias"


def test_penalties_are_parsed_into_the_sampling_parameters() -> None:
    params = parse({"prompt": "x", "presence_penalty": 0.5, "frequency_penalty": -1,
                    "logit_bias": {"7": -100}}, chat=False).params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.0)
    assert params.logit_bias == ((7, -100.0),)
    with pytest.raises(ApiError):
        parse({"prompt": "x", "frequency_penalty": 2.5}, chat=False)


@pytest.mark.parametrize("extra", [{"echo": True}, {"best_of": 3}])
def test_completion_options_this_server_cannot_honour_are_a_400(extra: dict) -> None:
    with pytest.raises(ApiError) as caught:
        parse({"prompt": "x", **extra}, chat=False)
    assert caught.value.status == 400 and caught.value.param == next(iter(extra))


async def test_top_p_zero_is_accepted_and_keeps_only_the_most_likely_token(
    serve: ServeFactory,
) -> None:
    served = await serve()
    body = {"prompt": "hi", "max_tokens": 6, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(served.url + "/completions",
                             json={**body, "temperature": 0}) as resp:
            greedy = (await resp.json())["choices"][0]["text"]
        async with http.post(served.url + "/completions",
                             json={**body, "temperature": 1.0, "top_p": 0}) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["text"] == greedy
