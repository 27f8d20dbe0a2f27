"""Requests no HTTP parser should accept, and how to send one and read the answer.

Shared by the gateway's and the local backend's tests: both answer them in OpenAI's
error shape, and neither may echo or log what the request carried (`SECRET`, or the
run of `a`s in an over-long header)."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

SECRET = "sk-live-do-not-log-me"


def post(headers: bytes, body: bytes = b"{}") -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: server\r\n" + headers
            + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))


# (request, status, error code)
MALFORMED = [
    pytest.param(post(b"X-Big: " + b"a" * 9000 + b"\r\n"), 431, "request_header_too_large",
                 id="header-too-long"),
    pytest.param(post(f"Authorization: Bearer {SECRET}\x01\r\n".encode()), 400, "invalid_http",
                 id="control-byte-in-key"),
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: server\r\nAuthorization: Bearer "
                 + SECRET.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
                 "invalid_http", id="bad-chunking"),
    pytest.param(b"P\x01ST /v1/chat/completions HTTP/1.1\r\nHost: server\r\n\r\n", 400,
                 "invalid_http", id="bad-method"),
]


async def raw_exchange(host: str, port: int,
                       request: bytes) -> tuple[int, dict[str, object], bytes]:
    """Send `request` as is on a new connection; (status, JSON body, the whole answer).
    The server closes the connection after a malformed request: read to the end."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body), answer


async def assert_refused_cleanly(host: str, port: int, request: bytes, status: int, code: str,
                                 caplog: pytest.LogCaptureFixture) -> None:
    """The server answers `request` with an OpenAI-shaped `status` error of `code`, logs
    it as a malformed request, and neither the answer nor the log repeats anything the
    request carried."""
    with caplog.at_level(logging.DEBUG):
        answered, body, answer = await raw_exchange(host, port, request)
    error = body["error"]
    assert answered == status and isinstance(error, dict) and error["code"] == code
    assert error["type"] == "invalid_request_error"
    logged = caplog.text + "".join(str(record.exc_info) for record in caplog.records)
    for carried in (SECRET, "aaaa"):
        assert carried.encode() not in answer and carried not in logged
    assert any("malformed HTTP request" in record.getMessage() for record in caplog.records)
