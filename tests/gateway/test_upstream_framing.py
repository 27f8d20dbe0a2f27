"""A backend that breaks HTTP/1.1 or SSE framing, through the real gateway: before the
first byte reaches the client the attempt fails at once and the next candidate answers
(or the client gets an OpenAI-shaped 502/504, never a 500); after it, the stream ends
with an error event at once, not when `total_s` runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import StartGateway, StartUpstream
from tests.fakes.raw_backend import CLOSE, RESET, Pause, Piece, RawBackend, answer
from tests.gateway.test_fallback import two_backend_policy

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "from the raw backend"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}})
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
# per backend: a short first byte, a long total (no test may wait for it)
TIMEOUTS = {"connect_s": 1.0, "first_byte_s": 0.5, "total_s": 30.0}


def event(content: str, finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": content},
                     "finish_reason": finish}]}) + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def trickled(data: bytes) -> list[Piece]:
    return [piece for byte in data for piece in (bytes([byte]), Pause(0.02))]


GARBAGE = b"\xff\x00 not what the header says " * 8
# fault → what the raw backend answers (to a plain request)
BEFORE_THE_FIRST_BYTE: dict[str, list[Piece]] = {
    "br that does not decode": [answer(GARBAGE, extra=b"Content-Encoding: br\r\n")],
    "zstd that does not decode": [answer(GARBAGE, extra=b"Content-Encoding: zstd\r\n")],
    "gzip that does not decode": [answer(GARBAGE, extra=b"Content-Encoding: gzip\r\n")],
    "an unknown encoding": [answer(GARBAGE, extra=b"Content-Encoding: lzma\r\n")],
    "JSON that is not UTF-8": [answer(b'{"choices": "\xff\xfe"}')],
    "a bad chunk size": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"zz\r\n{}\r\n", Pause(5.0)],
    "a bad chunk size mid-body": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  b"2\r\n{\"\r\n", Pause(0.1), b"-3\r\n", Pause(5.0)],
    "a head trickled a byte at a time": trickled(answer(COMPLETION)),
    "a 101": [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", Pause(5.0)],
}


@pytest.fixture
async def raw_backend() -> AsyncIterator[Callable[[Callable[[bytes], Sequence[Piece]]],
                                                  Any]]:
    started: list[RawBackend] = []

    async def start(script: Callable[[bytes], Sequence[Piece]]) -> RawBackend:
        backend = RawBackend(script)
        await backend.start()
        started.append(backend)
        return backend
    yield start
    for backend in started:
        await backend.stop()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.read()


@pytest.mark.parametrize("fault", list(BEFORE_THE_FIRST_BYTE))
async def test_a_framing_fault_before_the_first_byte_falls_back_at_once(
        raw_backend: Any, start_upstream: StartUpstream, start_gateway: StartGateway,
        fault: str) -> None:
    broken = await raw_backend(lambda body: BEFORE_THE_FIRST_BYTE[fault])
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(broken.url, spare.url,
                                                     timeouts=TIMEOUTS))
    started = time.monotonic()
    status, data = await _post(gateway.url, {**CHAT, "model": "chat"})
    assert status == 200, data
    assert orjson.loads(data)["choices"][0]["message"]["content"]
    assert len(spare.received) == 1 and broken.requests == 1
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("fault", list(BEFORE_THE_FIRST_BYTE))
async def test_a_framing_fault_with_no_fallback_is_an_openai_error_not_a_500(
        raw_backend: Any, start_gateway: StartGateway, fault: str) -> None:
    broken = await raw_backend(lambda body: BEFORE_THE_FIRST_BYTE[fault])
    policy = two_backend_policy(broken.url, broken.url, timeouts=TIMEOUTS)
    policy["routes"]["chat"]["targets"] = ["a/m"]
    gateway = await start_gateway(policy)
    status, data = await _post(gateway.url, CHAT)
    assert status in (502, 504), data
    assert set(orjson.loads(data)["error"]) >= {"message", "type", "code"}


async def test_interim_responses_are_skipped_and_the_answer_relayed(
        raw_backend: Any, start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    backend = await raw_backend(lambda body: [
        b"HTTP/1.1 100 Continue\r\n\r\n", Pause(0.02),
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", Pause(0.02), answer(COMPLETION)])
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(backend.url, spare.url,
                                                     timeouts=TIMEOUTS))
    for _ in range(3):
        status, data = await _post(gateway.url, CHAT)
        assert status == 200
        assert orjson.loads(data)["choices"][0]["message"]["content"] == "from the raw backend"
    assert not spare.received and backend.connections == 1


async def test_a_bare_cr_event_stream_is_relayed(
        raw_backend: Any, start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    events = (event("one") + event(" two", "stop") + b"data: [DONE]\n\n").replace(b"\n", b"\r")
    backend = await raw_backend(lambda body: [SSE_HEAD + chunk(events[:30]), Pause(0.02),
                                              chunk(events[30:]) + b"0\r\n\r\n"])
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(backend.url, spare.url,
                                                     timeouts=TIMEOUTS))
    status, data = await _post(gateway.url, {**CHAT, "stream": True})
    assert status == 200 and not spare.received
    contents = [orjson.loads(line[6:])["choices"][0]["delta"].get("content")
                for line in data.split(b"\n") if line.startswith(b"data: {")]
    assert contents == ["one", " two"] and data.endswith(b"data: [DONE]\n\n")


async def test_a_bad_chunk_mid_stream_ends_it_with_an_error_event_at_once(
        raw_backend: Any, start_gateway: StartGateway) -> None:
    backend = await raw_backend(lambda body: [SSE_HEAD + chunk(event("one")), Pause(0.1),
                                              b"zz\r\n", Pause(5.0)])
    policy = two_backend_policy(backend.url, backend.url, timeouts=TIMEOUTS)
    policy["routes"]["chat"]["targets"] = ["a/m"]
    gateway = await start_gateway(policy)
    started = time.monotonic()
    status, data = await _post(gateway.url, {**CHAT, "stream": True})
    assert time.monotonic() - started < 2.0
    assert status == 200
    lines = [line for line in data.split(b"\n") if line.startswith(b"data: ")]
    assert b'"content":"one"' in lines[0]
    assert "error" in orjson.loads(lines[-1][6:])


async def test_a_connection_the_backend_ends_after_its_answer_is_resent_and_counted(
        raw_backend: Any, start_gateway: StartGateway) -> None:
    # a backend that ends each kept-alive connection just after its answer (an idle
    # timeout, a max-requests-per-connection), unread what was sent on it meanwhile: no
    # client sees a 502 for it
    backend = await raw_backend(lambda body: [answer(COMPLETION), Pause(0.05), CLOSE])
    policy = two_backend_policy(backend.url, backend.url, timeouts=TIMEOUTS)
    policy["routes"]["chat"]["targets"] = ["a/m"]
    policy["defaults"] = {"limits": {"requests_per_minute": 100_000,
                                     "tokens_per_minute": 100_000_000}}
    gateway = await start_gateway(policy)
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(gateway.url + "/v1/chat/completions",
                                    json=CHAT) as response:
                await response.read()
                return response.status
        statuses = [status for _ in range(25)
                    for status in await asyncio.gather(*(one() for _ in range(4)))]
        async with session.get(gateway.url + "/metrics") as response:
            metrics = await response.text()
    assert statuses == [200] * 100
    resent = [line for line in metrics.splitlines()
              if line.startswith('routegate_upstream_resends_total{backend="a"}')]
    assert resent and float(resent[0].split()[-1]) > 0


async def test_a_stream_broken_before_its_first_whole_event_falls_back(
        raw_backend: Any, start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    half = event("one")[:20]  # the head and half an event: nothing the client could use
    backend = await raw_backend(lambda body: [SSE_HEAD + chunk(half), Pause(0.05), RESET])
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(backend.url, spare.url,
                                                     timeouts=TIMEOUTS))
    status, data = await _post(gateway.url, {**CHAT, "stream": True})
    assert status == 200 and len(spare.received) == 1
    assert b'"error"' not in data and data.endswith(b"data: [DONE]\n\n")
