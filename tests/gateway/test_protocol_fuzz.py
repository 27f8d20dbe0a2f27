"""The server's request parsing, fuzzed: generated request lines, headers, framings,
encodings and control characters, as raw bytes over a socket to the real app.

Whatever arrives, the gateway never answers 500 (nor any 5xx but the 505 that refuses
another HTTP version), never logs an error, never holds a connection past its timeouts
(every connection is closed by the gateway within a bound), and answers a good request
afterwards."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.live_gateway import CHAT_BODY, GOOD_REQUEST, exchange, live_gateway, statuses

# short timeouts, so that a connection left waiting is closed within the example
SERVER = {"header_read_timeout_s": 0.2, "body_read_timeout_s": 0.2,
          "keep_alive_timeout_s": 0.2, "max_body_bytes": 4096}
CLOSED_WITHIN_S = 4.0  # far past every timeout above: a connection open longer hangs

token = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                min_size=1, max_size=8).map(str.encode)
noise = st.binary(max_size=12)
methods = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE",
                           b"PATCH", b"CONNECT", b"PRI", b"G\x01T", b""]) | token
targets = st.sampled_from([
    b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/models",
    b"/v1/responses", b"/v1/messages", b"/v1/messages/count_tokens", b"/healthz",
    b"/readyz", b"/metrics", b"/admin/policy", b"/dashboard/data", b"*",
    b"http://gateway/v1/models", b"/v1/chat/completions?x=%00", b"/v1/%0a%1b%ff",
    b"//v1/models", b"/v1/../admin/policy", b""]) | noise
versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9",
                            b"HTTP/1.2", b"HTTP/1.1 ", b"http/1.1", b"HTTP/11", b""])
header_names = st.sampled_from([
    b"Host", b"Content-Length", b"Transfer-Encoding", b"Content-Encoding", b"Content-Type",
    b"Connection", b"Expect", b"Authorization", b"x-api-key", b"Upgrade", b"Accept",
    b"Cache-Control", b"traceparent", b"x-routegate-ttft-budget-ms", b"Host ",
    b" Host", b"X\x00Y"]) | token
header_values = st.sampled_from([
    b"0", b"5", b"61", b"-1", b"99999999999999999999", b"0x10", b"chunked",
    b"gzip, chunked", b"chunked, gzip", b"gzip", b"br", b"deflate", b"zstd", b"identity",
    b"100-continue", b"keep-alive", b"close", b"upgrade", b"h2c", b"websocket",
    b"application/json", b"Bearer sk-x", b"Bearer", b"\xff\xfe", b"a\x01b", b"a\x7fb",
    b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", b""]) | noise
bodies = st.sampled_from([
    b"", CHAT_BODY, gzip.compress(CHAT_BODY), b"{", b"[]", b"null",
    b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\nhello\r\n0\r\n\r\n", b"3\r\nab\r\n",
    b"ffffffffffffffffff\r\n", b"0\r\nTrailer: x\r\n\r\n", b"\r\n\r\n",
    orjson.dumps({"model": "chat\n\x1b", "messages": [{"role": "user", "content": "\x00"}]}),
    b"\x00" * 64, b"{" * 300 + b"}" * 300]) | st.binary(max_size=40)


def usually(valid: st.SearchStrategy[bytes], other: st.SearchStrategy[bytes]
            ) -> st.SearchStrategy[bytes]:
    """`valid` three times in four: most requests get far enough to reach the app."""
    return st.one_of(valid, valid, valid, other)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    newline = draw(usually(st.just(b"\r\n"), st.sampled_from([b"\n", b"\r"])))
    line = b" ".join([
        draw(usually(st.sampled_from([b"GET", b"POST"]), methods)),
        draw(usually(st.sampled_from([b"/v1/chat/completions", b"/v1/models", b"/healthz",
                                      b"/v1/responses", b"/v1/messages"]), targets)),
        draw(usually(st.just(b"HTTP/1.1"), versions))])
    if draw(st.integers(0, 9)) == 0:  # a request line cut or doubled in its spaces
        line = line.replace(b" ", draw(st.sampled_from([b"  ", b"\t", b""])), 1)
    headers = [b"Host: gateway"] if draw(usually(st.just(True), st.just(False))) else []
    for name, value in draw(st.lists(st.tuples(header_names, header_values), max_size=4)):
        headers.append(name + draw(usually(st.just(b": "), st.sampled_from(
            [b":", b" : ", b":\t", b": \x00"]))) + value)
    body = draw(usually(st.just(CHAT_BODY), bodies))
    if draw(usually(st.just(True), st.just(False))):
        headers.append(b"Content-Length: %d" % len(body))
    blank_lines = draw(usually(st.just(b""), st.sampled_from([b"\r\n", b"\r\n\r\n"])))
    raw = blank_lines + newline.join([line, *headers]) + newline + newline + body
    if draw(st.integers(0, 9)) == 0:  # half a request, and then nothing
        raw = raw[:draw(st.integers(0, len(raw)))]
    return raw


@contextmanager
def errors_logged() -> Iterator[list[logging.LogRecord]]:
    """Records at ERROR or above from the gateway or aiohttp (an unhandled exception)."""
    found: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record)

    handler = Collect(logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("routegate", "aiohttp", "asyncio")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield found
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


async def send(port: int, parts: list[bytes]) -> bytes:
    """`parts` written with a pause between them; everything answered until the gateway
    closes the connection (TimeoutError if it does not, within `CLOSED_WITHIN_S`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(0.02)
            writer.write(part)
        async with asyncio.timeout(CLOSED_WITHIN_S):
            return await reader.read()
    except ConnectionResetError:
        return b""  # closed on us while we wrote: closed all the same
    finally:
        writer.close()


def test_whatever_a_client_sends_gets_no_500_no_hang_and_the_server_keeps_answering() -> None:
    with live_gateway(server=SERVER) as (runner, gateway), errors_logged() as errors:

        @settings(max_examples=30, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.lists(requests(), min_size=1, max_size=2), st.integers(0, 200))
        def example(pipelined: list[bytes], split_at: int) -> None:
            raw = b"".join(pipelined)
            parts = [raw[:split_at], raw[split_at:]] if 0 < split_at < len(raw) else [raw]
            try:
                answer = runner.run(send(gateway.port, parts))
            except TimeoutError:
                raise AssertionError(f"the gateway held the connection open: {raw!r}") from None
            bad = [status for status in statuses(answer) if status >= 500 and status != 505]
            assert not bad, f"{bad} for {raw!r}: {answer[:400]!r}"
            assert not errors, [record.getMessage() for record in errors]
            good = GOOD_REQUEST.replace(b"Host: gateway\r\n",
                                        b"Host: gateway\r\nConnection: close\r\n")
            assert statuses(runner.run(exchange(gateway.port, good))) == [200]

        example()
