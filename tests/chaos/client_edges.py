"""Client-side scenarios of the chaos suite (issue 28's client half): connections that
send nothing or only blank lines, JSON nested past what the gateway writes back, and
request lines and headers that are valid to the parser but not to the gateway. Each
is answered with a clear error, promptly, and the gateway keeps serving."""

from __future__ import annotations

import asyncio
from functools import partial

from tests.chaos import clients
from tests.chaos.suite import Chaos, Scenario


def _post(path: bytes, data: bytes, *, version: bytes = b"HTTP/1.1",
          headers: bytes = b"") -> bytes:
    return (b"POST %b %b\r\nHost: chaos\r\nContent-Type: application/json\r\n%b"
            b"Content-Length: %d\r\n\r\n%b" % (path, version, headers, len(data), data))


async def silent_connections(chaos: Chaos, n: int) -> list[str]:
    """Connections that send nothing, or blank lines and then half a head: each is a
    408 after `server.header_read_timeout_s` (not a place held under the per-client cap
    for ever), and requests after them are served."""
    port = chaos.gateway.port
    starts = [b"", b"\r\n\r\n\r\n", b"\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: c"]
    silent = await asyncio.gather(*(clients.raw_exchange(port, starts[index % len(starts)])
                                    for index in range(max(n, 30))))
    return [*silent, *await chaos.requests(n, "healthy", False)]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def deep_json(chaos: Chaos, n: int) -> list[str]:
    """Valid JSON nested past orjson's 254 levels, on chat completions and the Responses
    API: a 400 naming the limit, before any backend is called."""
    port = chaos.gateway.port
    chat = b'{"model": "healthy", "messages": [{"role": "user", "content": "hi"}], ' \
           b'"metadata": {"deep": ' + _nested(300) + b"}}"
    responses = b'{"model": "healthy", "input": "hi", "metadata": {"deep": ' \
                + _nested(300) + b"}}"
    requests = [_post(b"/v1/chat/completions", chat), _post(b"/v1/responses", responses)]
    return await chaos.many(n, lambda: clients.raw_exchange(port, requests[0])) \
        + await chaos.many(n, lambda: clients.raw_exchange(port, requests[1]))


async def odd_http(chaos: Chaos, n: int) -> list[str]:
    """HTTP/2.0 and HTTP/0.9 request lines (a 505) and two Authorization headers (a 400)."""
    port = chaos.gateway.port
    data = clients.body("healthy", False)
    odd = [_post(b"/v1/chat/completions", data, version=b"HTTP/2.0"),
           b"GET /v1/models\r\n\r\n",
           _post(b"/v1/chat/completions", data,
                 headers=b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n")]
    answers: list[str] = []
    for request in odd:
        answers += await chaos.many(n, partial(clients.raw_exchange, port, request))
    return answers


CLIENT_EDGE_SCENARIOS: dict[str, Scenario] = {
    "client sends nothing": silent_connections,
    "client sends JSON 300 deep": deep_json,
    "client sends odd HTTP": odd_http,
}
