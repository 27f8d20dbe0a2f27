"""Slow and greedy clients hold nothing for long: a head trickled byte by byte and a
body that stalls are a 408, and one address holds a bounded number of connections."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy

CHAT = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})


async def _gateway(start_upstream: StartUpstream, start_gateway: StartGateway,
                   **server: object) -> RunningGateway:
    upstream = await start_upstream()
    return await start_gateway(single_backend_policy(upstream.url, server=server))


async def _open(gateway: RunningGateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    port = int(gateway.url.rsplit(":", 1)[1])
    return await asyncio.open_connection("127.0.0.1", port)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and body of the one response on a connection the gateway then closes."""
    raw = await asyncio.wait_for(reader.read(), 5.0)  # to EOF: the connection closes
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_a_head_trickled_a_byte_at_a_time_is_a_408_and_the_connection_closes(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.4)
    reader, writer = await _open(gateway)
    started = time.monotonic()

    async def trickle() -> None:
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: yes":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    status, body = await _answer(reader)
    trickling.cancel()
    writer.close()

    assert status == 408 and orjson.loads(body)["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < 2.0


async def test_a_body_that_stalls_is_a_408(start_upstream: StartUpstream,
                                           start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, body_read_timeout_s=0.3)
    reader, writer = await _open(gateway)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(CHAT), CHAT[:10]))  # the rest never comes

    status, body = await _answer(reader)
    writer.close()

    assert status == 408
    assert "server.body_read_timeout_s" in orjson.loads(body)["error"]["message"]


async def test_connections_past_the_per_client_cap_are_refused_at_once(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, max_connections_per_client=4)
    held = [await _open(gateway) for _ in range(4)]

    reader, writer = await _open(gateway)
    status, body = await _answer(reader)
    writer.close()
    assert status == 429 and orjson.loads(body)["error"]["code"] == "too_many_connections"

    held.pop()[1].close()  # one closed: the next is served
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=CHAT,
            headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
    for _, idle in held:
        idle.close()


async def test_a_kept_alive_connection_may_idle_longer_than_the_head_timeout(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.2)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(2):
            async with session.post(gateway.base_url + "/chat/completions", data=CHAT,
                                    headers={"Content-Type": "application/json"}) as response:
                assert response.status == 200
                await response.read()
            await asyncio.sleep(0.5)


async def test_the_rest_of_a_refused_body_is_not_taken_for_a_slow_head(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.2,
                             max_body_bytes=1000)
    reader, writer = await _open(gateway)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(10):  # the body keeps coming after the 413, for longer than 0.2 s
        writer.write(b"x" * 10_000)
        await asyncio.sleep(0.06)
    received = b""
    try:
        async with asyncio.timeout(1.0):
            while data := await reader.read(65536):
                received += data
    except TimeoutError:
        pass  # kept alive after its answer
    writer.close()

    assert received.startswith(b"HTTP/1.1 413 ") and received.count(b"HTTP/1.1 ") == 1


async def test_connections_that_send_nothing_time_out_and_free_the_per_client_cap(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.3,
                             max_connections_per_client=4)
    silent = [await _open(gateway) for _ in range(4)]
    started = time.monotonic()

    answers = [await _answer(reader) for reader, _ in silent]  # closed by the gateway

    assert [status for status, _ in answers] == [408] * 4
    assert time.monotonic() - started < 2.0
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=CHAT,
            headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
    for _, writer in silent:
        writer.close()


async def test_blank_lines_and_then_half_a_head_are_a_408(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.3)
    reader, writer = await _open(gateway)
    writer.write(b"\r\n\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")

    status, _ = await _answer(reader)
    writer.close()
    assert status == 408


async def test_blank_lines_and_half_a_head_on_a_kept_alive_connection_are_a_408(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, header_read_timeout_s=0.3)
    reader, writer = await _open(gateway)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5.0)
    assert first.startswith(b"HTTP/1.1 200 ")

    writer.write(b"\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    status, _ = await _answer(reader)
    writer.close()
    assert status == 408


async def test_an_idle_kept_alive_connection_closes_after_the_keep_alive_timeout(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    gateway = await _gateway(start_upstream, start_gateway, keep_alive_timeout_s=0.3)
    reader, writer = await _open(gateway)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5.0)
    assert first.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in first
    started = time.monotonic()

    rest = await asyncio.wait_for(reader.read(), 5.0)  # to EOF: the gateway closes

    writer.close()
    assert rest == b"" and time.monotonic() - started < 2.0
