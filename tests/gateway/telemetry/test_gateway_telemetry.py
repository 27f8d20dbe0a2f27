"""Telemetry through the real gateway in front of a real (fake-OpenAI) upstream on loopback."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.inference_time import parse_server_timing
from policies.keys import hash_key as key_hash
from tests.conftest import StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.telemetry.conftest import ACCESS_LOGGER, StartRaw, StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver

INBOUND_TRACE = "0af7651916cd43dd8448eb211c80319c"
INBOUND = f"00-{INBOUND_TRACE}-b7ad6b7169203331-01"
PROMPT = "the launch code for project marmalade is 4417"
API_KEY = "sk-rg-telemetry-test-7f3c9a1e5b"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": PROMPT}]}
GATEWAY_SPANS = [
    "routegate.auth", "routegate.rate_limit", "routegate.route", "routegate.queue.wait",
]


async def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body, headers=headers or {}) as response:
        return response.status, dict(response.headers), await response.read()


def sse_comment_timing(raw: bytes) -> dict[str, float]:
    events = raw.split(b"\n\n")
    (line,) = [e for e in events if e.startswith(b": server-timing ")]
    assert events.index(line) == events.index(b"data: [DONE]") - 1  # just before [DONE]
    return parse_server_timing(line.decode().removeprefix(": server-timing "))


async def test_one_trace_from_inbound_traceparent_to_the_upstream_call(
    openai_upstream: FakeOpenAI, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    traced = await start_traced(single_backend_policy(openai_upstream.url), otlp_url)
    status, _, _ = await post(traced.gateway.url, CHAT, {"traceparent": INBOUND})
    assert status == 200
    await traced.flush()
    spans = await receiver.wait_for(lambda s: any(x.kind == "SERVER" for x in s))

    (root,) = [s for s in spans if s.kind == "SERVER"]
    assert root.trace_id == INBOUND_TRACE and root.parent_span_id == "b7ad6b7169203331"
    assert root.service == "routegate"
    (upstream,) = [s for s in spans if s.kind == "CLIENT"]
    for span in [*(receiver.by_name(n)[0] for n in GATEWAY_SPANS), upstream]:
        assert span.trace_id == INBOUND_TRACE and span.parent_span_id == root.span_id
    assert upstream.name == "chat gpt-4o-mini"
    assert upstream.events == ["gen_ai.first_token"] or upstream.events == []
    # The upstream was asked to continue the trace under our CLIENT span.
    sent = openai_upstream.received[-1].headers["traceparent"]
    assert sent == f"00-{INBOUND_TRACE}-{upstream.span_id}-01"
    assert root.attributes["gen_ai.usage.output_tokens"] > 0
    assert root.attributes["routegate.backend"] == "up"
    assert root.attributes["http.response.status_code"] == 200


async def test_streamed_reply_ends_with_a_server_timing_comment_that_adds_up(
    start_upstream: StartUpstream, start_traced: StartTraced,
) -> None:
    upstream = await start_upstream(Behaviour(chunk_delay_s=0.002))
    traced = await start_traced(single_backend_policy(upstream.url))
    status, headers, raw = await post(traced.gateway.url, {**CHAT, "stream": True})
    assert status == 200
    final = sse_comment_timing(raw)
    assert {"gw", "queue", "upstream", "ttft", "total"} <= set(final)
    assert abs(final["gw"] + final["queue"] + final["upstream"] - final["total"]) <= 1.0
    assert final["ttft"] <= final["total"]
    assert "inference" not in final  # the fake reports nothing: unknown, not guessed
    early = parse_server_timing(headers["Server-Timing"])  # as of the first byte
    assert early["total"] <= final["total"]


async def test_every_response_carries_a_server_timing_split_that_adds_up(
    openai_upstream: FakeOpenAI, start_traced: StartTraced,
) -> None:
    traced = await start_traced(single_backend_policy(openai_upstream.url))
    for body in (CHAT, {"model": "nope", "messages": []}):
        _, headers, _ = await post(traced.gateway.url, body)
        t = parse_server_timing(headers["Server-Timing"])
        assert abs(t["gw"] + t["queue"] + t["upstream"] - t["total"]) <= 1.0


async def test_openai_processing_ms_is_reported_as_the_backends_own_time(
    start_upstream: StartUpstream, start_traced: StartTraced,
) -> None:
    upstream = await start_upstream(Behaviour(processing_ms=7))
    traced = await start_traced(single_backend_policy(upstream.url))
    await post(traced.gateway.url, CHAT)
    data = traced.telemetry.live.snapshot()
    assert data["backends"]["up"]["requests"] == 1
    assert data["backends"]["up"]["inference_ms"]["p50"] is None  # total ≠ inference


async def test_metrics_endpoint_after_traffic_has_requests_decisions_fallbacks_and_limits(
    start_upstream: StartUpstream, start_traced: StartTraced,
) -> None:
    broken = await start_upstream(Behaviour(status=500), name="broken")
    healthy = await start_upstream(name="healthy")
    policy = single_backend_policy(healthy.url, backend="good")
    policy["backends"]["bad"] = {"type": "openai", "url": broken.url,
                                 "models": {"gpt-4o-mini": {}}}
    policy["routes"]["chat"]["targets"] = ["bad/gpt-4o-mini", "good/gpt-4o-mini"]
    policy["defaults"] = {"limits": {"requests_per_minute": 2}}
    traced = await start_traced(policy)
    statuses = [(await post(traced.gateway.url, {**CHAT, "stream": s}))[0]
                for s in (False, True, False)]
    assert statuses == [200, 200, 429]
    async with aiohttp.ClientSession() as session, session.get(
            traced.gateway.url + "/metrics") as response:
        text = await response.text()
    found = {f.name: f.samples for f in text_string_to_metric_families(text)}
    for name in ("request_duration_seconds", "gateway_overhead_seconds", "queue_wait_seconds",
                 "upstream_first_byte_seconds", "ttft_seconds", "inter_token_latency_seconds",
                 "requests", "tokens", "routing_decisions", "fallbacks",
                 "rate_limit_rejections", "in_flight", "queue_depth"):
        assert found.get(f"routegate_{name}"), name
    requests = {(s.labels["backend"], s.labels["status"]): s.value
                for s in found["routegate_requests"] if s.name.endswith("_total")}
    assert requests[("good", "200")] == 2
    (fallback,) = [s for s in found["routegate_fallbacks"] if s.name.endswith("_total")]
    assert (fallback.labels["from_backend"], fallback.labels["to_backend"]) == ("bad", "good")


async def test_one_json_access_line_per_request_and_never_the_key_or_the_prompt(
    openai_upstream: FakeOpenAI, start_traced: StartTraced, caplog: pytest.LogCaptureFixture,
) -> None:
    policy = single_backend_policy(openai_upstream.url)
    policy["tenants"] = {"acme": {"api_keys": [key_hash(API_KEY)]}}
    policy["auth"] = {"anonymous": {"enabled": False}}
    traced = await start_traced(policy)
    caplog.set_level(logging.DEBUG)  # everything any logger says
    headers = {"Authorization": f"Bearer {API_KEY}", "traceparent": INBOUND}
    for body in (CHAT, {**CHAT, "stream": True}, {**CHAT, "model": "missing"}):
        await post(traced.gateway.url, body, headers)
    await post(traced.gateway.url, CHAT, {"Authorization": "Bearer sk-wrong-" + API_KEY})

    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    assert [line["status"] for line in lines] == [200, 200, 404, 401]
    first = lines[0]
    assert first["tenant"] == "acme" and first["trace_id"] == INBOUND_TRACE
    assert lines[2]["tenant"] == "acme" and lines[2]["error_code"] == "model_not_found"
    assert first["backend"] == "up" and first["route"] == "chat"
    assert first["input_tokens"] > 0 and first["output_tokens"] > 0
    assert {"total_ms", "gw_ms", "queue_ms", "upstream_ms"} <= set(first["timing"])
    assert "ttft_ms" in lines[1]["timing"]
    assert API_KEY not in caplog.text
    assert PROMPT not in caplog.text and "marmalade" not in caplog.text


async def test_access_lines_carry_the_time_the_client_and_the_request_id_and_no_empty_field(
    openai_upstream: FakeOpenAI, start_traced: StartTraced, caplog: pytest.LogCaptureFixture,
) -> None:
    traced = await start_traced(single_backend_policy(openai_upstream.url))
    caplog.set_level(logging.INFO, ACCESS_LOGGER)
    before = datetime.now(UTC)
    answers = [await post(traced.gateway.url, body)
               for body in (CHAT, {**CHAT, "model": "missing"}, {"model": "chat"})]

    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    assert [line["status"] for line in lines] == [200, 404, 400]
    for line, (_, headers, _) in zip(lines, answers, strict=True):
        assert next(iter(line)) == "time"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
        when = datetime.fromisoformat(line["time"])
        assert before - timedelta(seconds=1) <= when <= datetime.now(UTC)
        assert line["client"] == "127.0.0.1"
        assert line["request_id"] == {k.lower(): v for k, v in headers.items()}["x-request-id"]
        assert all(value not in ("", None, {}, []) for value in line.values()), line


async def test_ttft_is_measured_for_a_backend_that_writes_json_with_spaces(
    start_raw: StartRaw, start_traced: StartTraced, caplog: pytest.LogCaptureFixture,
) -> None:
    # Python's json.dumps, as some OpenAI-compatible servers write their chunks
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
               for word in ("Hello", " there")]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    url = await start_raw(web.Response(body=body + b"data: [DONE]\n\n",
                                       content_type="text/event-stream"))
    traced = await start_traced(single_backend_policy(url))
    caplog.set_level(logging.INFO, ACCESS_LOGGER)

    status, _, raw = await post(traced.gateway.url, {**CHAT, "stream": True})

    assert status == 200
    assert "ttft" in sse_comment_timing(raw)
    (line,) = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == ACCESS_LOGGER]
    assert "ttft_ms" in line["timing"]
