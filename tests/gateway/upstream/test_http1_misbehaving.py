"""The backend client against backends that break HTTP/1.1's framing: interim responses,
junk after a body, bad chunk sizes, trickled heads, compressed bodies, a close or reset
just after an answer. Each answer must reach the request it was sent for, or none."""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import brotli
import orjson
import pytest

from gateway.compat.aiohttp import MalformedResponse
from gateway.core.deadline import Timeouts
from gateway.upstream.http1 import Http1Client
from tests.fakes.raw_backend import CLOSE, RESET, Pause, Piece, RawBackend, answer

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,unused-ignore]

RELAXED = Timeouts(connect_s=2.0, first_byte_s=5.0, total_s=10.0)


@pytest.fixture
async def backends() -> AsyncIterator[list[RawBackend]]:
    started: list[RawBackend] = []
    yield started
    for backend in started:
        await backend.stop()


async def start(backends: list[RawBackend],
                script: Callable[[bytes], Sequence[Piece]]) -> RawBackend:
    backend = RawBackend(script)
    await backend.start()
    backends.append(backend)
    return backend


async def ask(client: Http1Client, secret: str) -> tuple[int, bytes]:
    response = await client.post("/x", orjson.dumps({"secret": secret}))
    try:
        return response.status, await response.read()
    finally:
        response.release()


def echo(body: bytes) -> bytes:
    return orjson.dumps({"echo": orjson.loads(body)["secret"]})


@pytest.mark.parametrize("interim", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
])
async def test_interim_responses_before_the_answer_are_skipped(
        backends: list[RawBackend], interim: bytes) -> None:
    backend = await start(backends, lambda body: [interim, Pause(0.02), answer(echo(body))])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    for n in range(3):
        assert await ask(client, f"s{n}") == (200, b'{"echo":"s%d"}' % n)
    assert backend.connections == 1  # each answer read whole: the connection kept
    await client.close()


async def test_an_answer_behind_an_interim_response_never_reaches_the_next_request(
        backends: list[RawBackend]) -> None:
    # the reported case: 100 Continue taken as the answer, the real one left unread on a
    # connection back in the pool, and read by the next request (another tenant's)
    backend = await start(backends, lambda body: [b"HTTP/1.1 100 Continue\r\n\r\n",
                                                  Pause(0.05), answer(echo(body))])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    for n in range(4):
        status, data = await ask(client, f"tenant-{n}")
        assert (status, data) == (200, b'{"echo":"tenant-%d"}' % n)
    await client.close()


async def test_bytes_arriving_on_an_idle_connection_discard_it(
        backends: list[RawBackend]) -> None:
    def twice(body: bytes) -> list[Piece]:  # the answer, then (late) the same answer again
        return [answer(echo(body)), Pause(0.02), answer(echo(body))]
    backend = await start(backends, twice)
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    for n in range(3):
        assert await ask(client, f"s{n}") == (200, b'{"echo":"s%d"}' % n)
        await asyncio.sleep(0.1)  # idle while the stray answer arrives
    assert backend.connections == 3
    await client.close()


async def test_junk_that_came_with_a_body_keeps_the_connection_out_of_the_pool(
        backends: list[RawBackend]) -> None:
    backend = await start(backends, lambda body: [answer(echo(body)) + answer(b"junk")])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    for n in range(3):
        assert await ask(client, f"s{n}") == (200, b'{"echo":"s%d"}' % n)
    assert backend.connections == 3
    await client.close()


async def test_a_101_or_endless_interim_responses_are_a_malformed_answer(
        backends: list[RawBackend]) -> None:
    for reply in (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",
                  b"HTTP/1.1 103 Early Hints\r\n\r\n" * 40):
        backend = await start(backends, lambda body, reply=reply: [reply, Pause(1.0)])
        client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
        started = time.monotonic()
        with pytest.raises(MalformedResponse):
            await client.post("/x", b"{}")
        assert time.monotonic() - started < 0.5
        await client.close()


CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


@pytest.mark.parametrize("bad", [b"zz\r\nxx\r\n", b"5\r\ntoo long for five\r\n",
                                 b"-1\r\n", b"ffffffffffffffffffff\r\n"])
async def test_a_malformed_chunk_mid_body_fails_the_read_at_once(
        backends: list[RawBackend], bad: bytes) -> None:
    backend = await start(backends, lambda body: [
        CHUNKED_HEAD + b"6\r\ndata: \r\n", Pause(0.1), bad, Pause(3.0)])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    response = await client.post("/x", b"{}")
    started = time.monotonic()
    assert await response.content.readany() == b"data: "
    with pytest.raises(aiohttp.ClientPayloadError):
        while await response.content.readany():
            pass
    assert time.monotonic() - started < 1.0  # not first_byte_s, not total_s
    response.close()
    await client.close()


async def test_a_malformed_chunk_in_the_first_read_is_a_client_error(
        backends: list[RawBackend]) -> None:
    backend = await start(backends, lambda body: [CHUNKED_HEAD + b"zz\r\n", Pause(1.0)])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    with pytest.raises(aiohttp.ClientError):  # not aiohttp's HttpProcessingError
        response = await client.post("/x", b"{}")
        await response.read()
    await client.close()


async def test_a_head_trickled_a_byte_at_a_time_is_bounded_by_first_byte_s(
        backends: list[RawBackend]) -> None:
    head = answer(b"{}", extra=b"X-Slow: " + b"x" * 200 + b"\r\n")

    def trickle(body: bytes) -> list[Piece]:
        return [piece for byte in head for piece in (bytes([byte]), Pause(0.01))]
    backend = await start(backends, trickle)
    client = Http1Client(backend.url, max_connections=1,
                         timeouts=Timeouts(connect_s=1.0, first_byte_s=0.3, total_s=10.0))
    started = time.monotonic()
    with pytest.raises(aiohttp.ServerTimeoutError):
        await client.post("/x", b"{}")
    assert time.monotonic() - started < 1.5
    await client.close()


def _encoded(encoding: str, data: bytes) -> bytes:
    if encoding == "br":
        return bytes(brotli.compress(data))
    if encoding == "zstd":
        return bytes(zstd.compress(data))
    return gzip.compress(data)


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip"])
async def test_compressed_bodies_are_decoded(backends: list[RawBackend],
                                             encoding: str) -> None:
    text = orjson.dumps({"choices": [{"message": {"content": "hello " * 200}}]})
    backend = await start(backends, lambda body: [answer(
        _encoded(encoding, text), extra=b"Content-Encoding: %b\r\n" % encoding.encode())])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    assert await ask(client, "s") == (200, text)
    await client.close()


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip", "deflate"])
async def test_a_body_that_does_not_decode_is_a_client_error(
        backends: list[RawBackend], encoding: str) -> None:
    garbage = b"\xff\x00not compressed at all" * 10
    backend = await start(backends, lambda body: [answer(
        garbage, extra=b"Content-Encoding: %b\r\n" % encoding.encode())])
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED)
    with pytest.raises(aiohttp.ClientError):
        await ask(client, "s")
    await client.close()


@pytest.mark.parametrize("end", [CLOSE, RESET])
async def test_a_reused_connection_ended_just_after_its_answer_is_resent_and_counted(
        backends: list[RawBackend], end: object) -> None:
    # the backend ends each connection just after its answer, as an idle timeout or a
    # max-requests-per-connection would; the next request, already on its way on that
    # connection, is sent again on a new one
    backend = await start(backends, lambda body: [answer(echo(body)), Pause(0.001), end])
    resent: list[int] = []
    client = Http1Client(backend.url, max_connections=2, timeouts=RELAXED,
                         on_resend=lambda: resent.append(1))
    results = await asyncio.gather(*(ask(client, f"s{n}") for n in range(200)))
    assert results == [(200, b'{"echo":"s%d"}' % n) for n in range(200)]
    assert resent  # (the backend never read a request sent on a connection it ended)
    await client.close()


async def test_a_reused_connection_that_broke_off_an_answer_is_not_resent(
        backends: list[RawBackend]) -> None:
    served: list[int] = []

    def script(body: bytes) -> list[Piece]:
        served.append(1)
        if len(served) == 2:  # half a head, then the connection ends
            return [b"HTTP/1.1 200 OK\r\nContent-Le", CLOSE]
        return [answer(echo(body))]
    backend = await start(backends, script)
    client = Http1Client(backend.url, max_connections=1, timeouts=RELAXED,
                         on_resend=lambda: served.append(0))
    assert await ask(client, "s0") == (200, b'{"echo":"s0"}')
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await ask(client, "s1")  # the backend may have acted on it: not sent twice
    assert backend.requests == 2
    await client.close()
