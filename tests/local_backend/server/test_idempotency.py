"""A request sent again under one `Idempotency-Key` runs once in the engine: a second
sent while the first runs attaches to it, one sent later gets the kept answer, even when
the first caller went away mid-run; the key is scoped by `cache_salt`; a reused key
with another body, a malformed key and a streamed request with a key are refused by name.

The engine's own count of requests it admitted (`/metrics`, by band) is the evidence:
sampling at temperature 1 without a seed, two runs would not answer alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from local_backend.server.app import create_app
from tests.local_backend.conftest import EngineFactory

KEY = "batch_0123/17"
BODY: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 120, "temperature": 1.0, "ignore_eos": True,
                        "cache_salt": "tenant-a"}


@pytest.fixture
async def base_url(make_engine: EngineFactory, aiohttp_server: Any) -> str:
    app = create_app(make_engine(start=False), model_name="tiny")
    server = await aiohttp_server(app)  # a caller that disconnects cancels its handler
    return str(server.make_url(""))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, base_url: str, body: dict[str, Any],
               key: str | None = KEY) -> tuple[int, dict[str, Any], bool]:
    headers = {} if key is None else {"Idempotency-Key": key}
    async with http.post(base_url + "/v1/chat/completions", json=body,
                         headers=headers) as response:
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return response.status, await response.json(), replayed


async def metric(http: aiohttp.ClientSession, base_url: str, name: str,
                 **labels: str) -> float:
    async with http.get(base_url + "/metrics") as response:
        text = await response.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == name
               and all(sample.labels.get(k) == v for k, v in labels.items()))


async def engine_runs(http: aiohttp.ClientSession, base_url: str) -> float:
    return await metric(http, base_url, "routegate:request_queue_time_seconds_by_band_count")


async def test_two_concurrent_requests_with_one_key_run_once_and_get_one_answer(
        base_url: str, http: aiohttp.ClientSession) -> None:
    first, second = await asyncio.gather(post(http, base_url, BODY),
                                         post(http, base_url, BODY))
    assert first[0] == second[0] == 200
    assert first[1] == second[1]  # the same id, text and usage
    assert await engine_runs(http, base_url) == 1
    assert await metric(http, base_url, "routegate:idempotent_requests_total",
                        outcome="attached") == 1

    status, later, replayed = await post(http, base_url, BODY)
    assert status == 200 and later == first[1] and replayed
    assert await engine_runs(http, base_url) == 1


async def test_a_request_whose_caller_went_away_still_finishes_for_the_one_sent_again(
        base_url: str, http: aiohttp.ClientSession) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # the caller (a gateway replica) dies mid-run
            await post(http, base_url, BODY)
    status, answer, _ = await post(http, base_url, BODY)
    assert status == 200 and answer["usage"]["completion_tokens"] == BODY["max_tokens"]
    assert await engine_runs(http, base_url) == 1


async def test_the_key_is_scoped_by_the_cache_salt(
        base_url: str, http: aiohttp.ClientSession) -> None:
    _, mine, _ = await post(http, base_url, BODY)
    status, theirs, replayed = await post(http, base_url, {**BODY, "cache_salt": "tenant-b"})
    assert status == 200 and not replayed and theirs["id"] != mine["id"]
    _, unsalted, replayed = await post(http, base_url, {k: v for k, v in BODY.items()
                                                        if k != "cache_salt"})
    assert not replayed and unsalted["id"] != mine["id"]
    assert await engine_runs(http, base_url) == 3


async def test_requests_without_a_key_each_run(
        base_url: str, http: aiohttp.ClientSession) -> None:
    await asyncio.gather(post(http, base_url, BODY, key=None),
                         post(http, base_url, BODY, key=None))
    assert await engine_runs(http, base_url) == 2


async def test_a_key_reused_with_another_body_is_refused_not_answered(
        base_url: str, http: aiohttp.ClientSession) -> None:
    await post(http, base_url, BODY)
    status, error, _ = await post(http, base_url, {**BODY, "max_tokens": 3})
    assert status == 422
    assert error["error"]["code"] == "idempotency_key_reused"
    assert error["error"]["param"] == "Idempotency-Key"
    assert "choices" not in error


@pytest.mark.parametrize(("key", "stream"), [
    ("k" * 257, False),  # too long
    ("batch\t1", False),  # a control character
    ("batch 1", False),  # a space
    (KEY, True),  # a stream cannot be replayed
])
async def test_a_bad_key_or_a_streamed_request_with_a_key_is_a_400_naming_the_header(
        base_url: str, http: aiohttp.ClientSession, key: str, stream: bool) -> None:
    status, error, _ = await post(http, base_url, {**BODY, "stream": stream}, key=key)
    assert status == 400 and error["error"]["param"] == "Idempotency-Key"
    assert await engine_runs(http, base_url) == 0
