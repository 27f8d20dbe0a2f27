"""The request's deadline, end to end: every attempt bounded by what is left of the budget."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
ON_TIME_S = 0.05  # the client hears about a passed deadline within this of it
# Priors that predict a TTFT of about `network_ms` (prefill of a few tokens is instant).
QUICK = {"network_ms": 10, "prefill_tokens_per_s": 1_000_000, "decode_tokens_per_s": 1000}


def policy(urls: dict[str, str], *, budget: dict[str, float] | None = None,
           priors: dict[str, dict[str, Any]] | None = None,
           timeouts: dict[str, float] | None = None) -> dict[str, Any]:
    backends = {}
    for price, (name, url) in enumerate(urls.items()):  # declared order is cheapest first
        spec = {"input_usd_per_mtok": price, "output_usd_per_mtok": price,
                "priors": (priors or {}).get(name, QUICK)}
        backends[name] = {"type": "openai", "url": url, "models": {"m": spec},
                          **({"timeouts": timeouts} if timeouts else {})}
    route: dict[str, Any] = {"targets": [f"{name}/m" for name in urls]}
    if budget:
        route["latency_budget"] = budget
    return {"version": 1, "backends": backends, "routes": {"chat": route},
            "auth": {"anonymous": {"enabled": True}}}


async def post(url: str, body: dict[str, Any] = BODY, headers: dict[str, str] | None = None,
               ) -> tuple[int, Any, float]:
    """(status, JSON or SSE text, seconds taken)."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body, headers=headers or {}) as response:
        data = await (response.text() if body.get("stream") else response.json())
        return response.status, data, time.perf_counter() - started


async def test_a_stalled_upstream_answers_504_at_the_total_deadline(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    stalled = await start_upstream(Behaviour(first_byte_delay_s=5))
    gateway = await start_gateway(policy({"a": stalled.url}, budget={"total_ms": 400}))

    status, body, took_s = await post(gateway.url)

    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert "a/m" in body["error"]["message"]
    assert 0.4 <= took_s < 0.4 + ON_TIME_S
    assert len(stalled.received) == 1


async def test_the_ttft_budget_header_bounds_the_wait_for_the_first_byte(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    stalled = await start_upstream(Behaviour(first_byte_delay_s=5))
    gateway = await start_gateway(policy({"a": stalled.url}, budget={"ttft_ms": 5000}))

    status, body, took_s = await post(gateway.url,
                                      headers={"x-routegate-ttft-budget-ms": "300"})

    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert 0.3 <= took_s < 0.3 + ON_TIME_S


async def test_a_fallback_predicted_not_to_fit_what_is_left_is_skipped(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    # The primary takes 300 ms to fail; 400 ms are left, and the fallback is predicted
    # to need 500 ms before its first token: trying it would only answer too late.
    failing = await start_upstream(Behaviour(status=503, first_byte_delay_s=0.3))
    slow = await start_upstream()
    gateway = await start_gateway(policy(
        {"a": failing.url, "b": slow.url}, budget={"ttft_ms": 700},
        priors={"b": {**QUICK, "network_ms": 500}}))

    status, body, took_s = await post(gateway.url)

    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    message = body["error"]["message"]
    assert "a/m" in message and "HTTP 503" in message
    assert "b/m: predicted TTFT 500 ms" in message
    assert took_s < 0.5  # said at once, not at the deadline
    assert len(failing.received) == 1 and slow.received == []


async def test_a_fallback_that_still_fits_is_tried(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=503, first_byte_delay_s=0.1))
    spare = await start_upstream()
    gateway = await start_gateway(policy(
        {"a": failing.url, "b": spare.url}, budget={"ttft_ms": 700},
        priors={"b": {**QUICK, "network_ms": 300}}))

    status, _, _ = await post(gateway.url)

    assert status == 200 and len(spare.received) == 1


async def test_the_backend_is_told_how_much_of_the_budget_is_left(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy({"a": fake.url}, budget={"total_ms": 8000}))

    status, _, _ = await post(gateway.url, headers={"x-routegate-total-budget-ms": "2000"})

    assert status == 200
    left_ms = int(fake.received[0].headers["x-routegate-deadline-ms"])
    assert 1900 < left_ms <= 2000


async def test_a_request_without_a_budget_sends_no_deadline(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fake = await start_upstream()
    gateway = await start_gateway(policy({"a": fake.url}))
    status, _, _ = await post(gateway.url)
    assert status == 200 and "x-routegate-deadline-ms" not in fake.received[0].headers


async def test_a_stream_still_running_at_the_deadline_ends_with_an_error_event_then(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    dawdling = await start_upstream(Behaviour(chunk_delay_s=0.2))
    gateway = await start_gateway(policy({"a": dawdling.url}, budget={"total_ms": 500}))

    status, text, took_s = await post(gateway.url, {**BODY, "stream": True})

    assert status == 200
    assert '"error"' in text and "[DONE]" not in text
    assert 0.5 <= took_s < 0.5 + ON_TIME_S


async def test_silences_between_stream_events_are_not_cut_by_the_ttft_budget(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    # Each gap is longer than what was left of the TTFT budget when the headers came:
    # the first token arrived on time, so the stream runs to its end.
    gappy = await start_upstream(Behaviour(chunk_delay_s=0.25, reply="one two three"))
    gateway = await start_gateway(policy({"a": gappy.url}, budget={"ttft_ms": 200}))

    status, text, took_s = await post(gateway.url, {**BODY, "stream": True})

    assert status == 200 and "[DONE]" in text and '"error"' not in text
    assert took_s > 0.75


@pytest.mark.parametrize("stream", [False, True])
async def test_the_sdk_sees_a_504_deadline_exceeded(
        start_upstream: StartUpstream, start_gateway: StartGateway, stream: bool) -> None:
    stalled = await start_upstream(Behaviour(first_byte_delay_s=5))
    gateway = await start_gateway(policy({"a": stalled.url}, budget={"ttft_ms": 300}))

    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.openai().chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], stream=stream)

    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "deadline_exceeded"  # type: ignore[index]
