"""Request lines and headers HTTP/1.1 allows the parser to take but the gateway must not
answer as if nothing were wrong: another HTTP version, and a key sent twice."""

from __future__ import annotations

import orjson
import pytest

from policies import hash_key
from tests.conftest import RunningGateway, StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.live_gateway import CHAT_BODY, GOOD_REQUEST, exchange, statuses

TENANT_KEY, ADMIN_KEY = "sk-tenant-edge", "sk-admin-edge"


def port_of(gateway: RunningGateway) -> int:
    return int(gateway.url.rsplit(":", 1)[1])


@pytest.mark.parametrize("request_line", [
    b"GET /healthz HTTP/2.0", b"GET /healthz HTTP/0.9", b"GET /healthz",
    b"POST /v1/chat/completions HTTP/2.0"], ids=["2.0", "0.9", "no-version", "2.0-post"])
async def test_a_request_line_of_another_http_version_is_a_505_in_http_1_1(
        gateway: RunningGateway, openai_upstream: FakeOpenAI, request_line: bytes) -> None:
    body = CHAT_BODY if request_line.startswith(b"POST") else b""
    answer = await exchange(port_of(gateway), request_line + (
        b"\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body)))

    head, _, error = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 505 ") and b"Connection: close" in head
    assert orjson.loads(error)["error"]["code"] == "http_version_not_supported"
    assert openai_upstream.received == []
    assert statuses(await exchange(port_of(gateway), GOOD_REQUEST.replace(
        b"Host: gateway\r\n", b"Host: gateway\r\nConnection: close\r\n"))) == [200]


@pytest.mark.parametrize("headers", [
    [("Authorization", f"Bearer {TENANT_KEY}"), ("Authorization", "Bearer sk-other")],
    [("Authorization", "Bearer sk-other"), ("Authorization", f"Bearer {TENANT_KEY}")],
    [("x-api-key", TENANT_KEY), ("x-api-key", "sk-other")],
], ids=["authorization-first-known", "authorization-second-known", "x-api-key"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/admin/policy"])
async def test_a_key_header_sent_twice_is_a_400(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        headers: list[tuple[str, str]], path: str) -> None:
    gateway = await start_gateway(single_backend_policy(
        openai_upstream.url,
        tenants={"acme": {"api_keys": [hash_key(TENANT_KEY)]}},
        auth={"anonymous": {"enabled": False}, "admin_keys": [hash_key(ADMIN_KEY)]}))
    method = b"POST" if path == "/v1/chat/completions" else b"GET"
    body = CHAT_BODY if method == b"POST" else b""
    lines = b"".join(f"{name}: {value}\r\n".encode() for name, value in headers)
    answer = await exchange(port_of(gateway), (
        b"%b %b HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n%b"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b")
        % (method, path.encode(), lines, len(body), body))

    head, _, error = answer.partition(b"\r\n\r\n")
    assert statuses(head) == [400], answer
    assert orjson.loads(error)["error"]["code"] == "duplicate_header"
    assert openai_upstream.received == []


@pytest.mark.parametrize("framing", [
    b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(CHAT_BODY), len(CHAT_BODY)),
    b"Content-Length: %d\r\nContent-Length: 5\r\n" % len(CHAT_BODY),
    b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(CHAT_BODY),
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
], ids=["same-length-twice", "two-lengths", "length-and-chunked", "chunked-twice"])
async def test_framing_headers_that_disagree_or_repeat_are_a_400(
        gateway: RunningGateway, openai_upstream: FakeOpenAI, framing: bytes) -> None:
    """aiohttp's parser refuses these itself (request smuggling); the gateway answers
    them OpenAI-shaped."""
    answer = await exchange(port_of(gateway), (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n%b\r\n%b")
        % (framing, CHAT_BODY))
    head, _, error = answer.partition(b"\r\n\r\n")
    assert statuses(head) == [400]
    assert orjson.loads(error)["error"]["code"] == "invalid_http"
    assert openai_upstream.received == []
