"""JSON nested deeper than the gateway accepts is a 400 naming the limit, refused as the
body is parsed: before any backend is called, on every endpoint that parses a body, and
the access log records the status the client got."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pipeline.request_body import MAX_JSON_DEPTH, nesting_depth
from tests.conftest import RunningGateway, StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.live_gateway import exchange, live_gateway, statuses

MESSAGES = [{"role": "user", "content": "hi"}]
ORJSON_LIMIT = 254  # the deepest orjson writes: a body past it could not be re-serialised


def nested(depth: int) -> bytes:
    """`depth` levels of objects and arrays, alternating, innermost a string, as JSON
    (orjson itself refuses to write past 254 levels)."""
    opening = b"".join(b"[" if level % 2 else b'{"k":' for level in range(depth))
    closing = b"".join(b"]" if level % 2 else b"}" for level in reversed(range(depth)))
    return opening + b'"x"' + closing


def deep_request(endpoint: str, depth: int) -> bytes:
    """A valid request for `endpoint` whose JSON nests `depth` levels in all (the body
    object, `metadata`, a list, and the rest)."""
    if endpoint == "responses":
        fields = b'"model": "chat", "input": "hi"'
    elif endpoint.startswith("messages"):
        fields = b'"model": "chat", "max_tokens": 5, "messages": ' + orjson.dumps(MESSAGES)
    else:
        fields = b'"model": "chat", "temperature": 0, "messages": ' + orjson.dumps(MESSAGES)
    return b"{" + fields + b', "metadata": {"deep": [' + nested(depth - 3) + b"]}}"


def access_statuses(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [orjson.loads(record.getMessage())["status"] for record in caplog.records
            if record.name == "routegate.access"]


async def post(gateway: RunningGateway, endpoint: str, body: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            f"{gateway.base_url}/{endpoint}", data=body,
            headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.json(content_type=None)


def test_the_depth_check_counts_json_as_nested() -> None:
    assert nesting_depth(deep_request("chat/completions", 300)) == 300
    assert depth_of(orjson.loads(deep_request("responses", 200))) == 200


@pytest.mark.parametrize("endpoint", ["chat/completions", "responses", "messages",
                                      "messages/count_tokens"])
@pytest.mark.parametrize("cached", [False, True], ids=["plain-route", "cached-route"])
async def test_json_past_the_depth_limit_is_a_400_before_any_backend_call(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        caplog: pytest.LogCaptureFixture, endpoint: str, cached: bool) -> None:
    policy = single_backend_policy(openai_upstream.url)
    if cached:
        policy["routes"]["chat"]["cache"] = {"ttl_s": 60, "store_content": True}
    gateway = await start_gateway(policy)
    body = deep_request(endpoint, ORJSON_LIMIT + 20)

    with caplog.at_level(logging.INFO):
        status, answer = await post(gateway, endpoint, body)

    assert status == 400, answer
    assert f"deeper than {MAX_JSON_DEPTH} levels" in answer["error"]["message"]
    assert openai_upstream.received == []
    assert set(access_statuses(caplog)) <= {400}


async def test_json_at_the_depth_limit_is_served(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    policy = single_backend_policy(openai_upstream.url)
    policy["routes"]["chat"]["cache"] = {"ttl_s": 60, "store_content": True}
    gateway = await start_gateway(policy)
    for endpoint in ("chat/completions", "responses", "messages"):
        status, answer = await post(gateway, endpoint, deep_request(endpoint, MAX_JSON_DEPTH))
        assert status == 200, answer


async def test_the_access_log_records_the_status_the_client_got_from_a_translated_api(
        start_gateway: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    """A native Responses backend whose answer is no `response` object: the client gets
    a 502, found after the backend answered, and the access log says 502 too."""
    async def not_a_response(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"object": "chat.completion", "choices": []})

    app = web.Application()
    app.router.add_post("/v1/responses", not_a_response)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        policy = single_backend_policy(f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        policy["backends"]["up"]["responses"] = "native"
        gateway = await start_gateway(policy)
        with caplog.at_level(logging.INFO):
            status, _ = await post(gateway, "responses", deep_request("responses", 3))
    finally:
        await runner.cleanup()
    assert status == 502
    assert access_statuses(caplog) == [502]


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(1, ORJSON_LIMIT + 40), endpoint=st.sampled_from(
    ["chat/completions", "responses", "messages", "messages/count_tokens", "embeddings"]))
def test_no_depth_of_json_makes_a_500(depth: int, endpoint: str) -> None:
    body = (b'{"model": "chat", "messages": ' + orjson.dumps(MESSAGES) + b', "input": '
            + nested(depth - 1) + b"}")
    routes = {"chat": {"targets": ["up/gpt-4o-mini"],
                       "cache": {"ttl_s": 60, "store_content": True}}}
    with live_gateway(routes=routes) as (runner, gateway):
        answer = runner.run(exchange(gateway.port, (
            b"POST /v1/%b HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b")
            % (endpoint.encode(), len(body), body)))
    status = statuses(answer)[0]
    assert status < 500, answer[:400]
    if depth > MAX_JSON_DEPTH:
        assert status == 400 and b"deeper than %d levels" % MAX_JSON_DEPTH in answer


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
    | st.text(alphabet="[]{}\"\\ab", max_size=6),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(alphabet="[]{}\"\\k", max_size=3), inner, max_size=3),
    max_leaves=30)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@settings(max_examples=150, deadline=None)
@given(json_values, st.booleans())
def test_nesting_depth_is_the_depth_of_the_parsed_value(value: Any, indent: bool) -> None:
    raw = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0)
    assert nesting_depth(raw) == depth_of(value)
