"""`x-routegate-deadline-ms`: the server drops or stops work nobody waits for any more."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp

from tests.local_backend.server.conftest import Served, ServeFactory

# As long as the tiny model goes (512 positions): 0.2 s to a few seconds of decoding,
# by the machine
LONG = {"model": "tiny", "prompt": [256, 10, 20], "max_tokens": 500, "temperature": 0,
        "ignore_eos": True}


async def post(served: Served, body: dict[str, Any], deadline_ms: str | None,
               ) -> tuple[int, Any, float]:
    headers = {} if deadline_ms is None else {"x-routegate-deadline-ms": deadline_ms}
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session, session.post(
            served.url + "/completions", json=body, headers=headers) as response:
        data = await (response.text() if body.get("stream") else response.json())
        return response.status, data, time.perf_counter() - started


async def holding_the_only_slot(served: Served, requests: int = 1) -> asyncio.Future[Any]:
    """`requests` long requests: one running (in the engine's only slot), the rest queued
    behind it, so that the slot stays taken for `requests` times a long decode."""
    holder = asyncio.gather(*(post(served, LONG, None) for _ in range(requests)))
    for _ in range(1000):  # the engine runs in its own thread: polled
        if served.engine.scheduler.running:
            break
        await asyncio.sleep(0.005)
    return holder


async def release(holder: asyncio.Future[Any]) -> None:
    holder.cancel()  # the clients go away: the engine aborts them
    with contextlib.suppress(asyncio.CancelledError):
        await holder


async def test_a_request_still_queued_at_its_deadline_is_dropped_with_504(
        serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=1, num_blocks=512)
    holder = await holding_the_only_slot(served, requests=4)  # longer than the deadline

    status, body, took_s = await post(served, {**LONG, "max_tokens": 4}, "200")

    assert status == 504 and body["error"]["code"] == "deadline_exceeded"
    assert 0.2 <= took_s < 0.4
    assert served.engine.stats().aborted == 0  # dropped by its deadline, not by a client
    await release(holder)


async def test_a_stream_still_queued_at_its_deadline_ends_with_an_error_event(
        serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=1, num_blocks=512)
    holder = await holding_the_only_slot(served, requests=4)  # longer than the deadline

    status, text, _ = await post(served, {**LONG, "stream": True}, "150")

    assert status == 200 and '"deadline_exceeded"' in text
    await release(holder)


async def test_a_request_past_its_deadline_mid_decode_stops_with_finish_reason_length(
        serve: ServeFactory) -> None:
    # this machine's pace, with no deadline, on an engine of its own (one that knows its
    # pace refuses at once what cannot finish in time, before any decoding)
    _, _, whole_s = await post(await serve(num_blocks=512), LONG, None)
    deadline_ms = max(30, round(whole_s * 1000 / 3))

    status, body, took_s = await post(await serve(num_blocks=512), LONG, str(deadline_ms))

    assert status == 200
    assert body["choices"][0]["finish_reason"] == "length"
    assert 0 < body["usage"]["completion_tokens"] < LONG["max_tokens"]
    assert took_s < whole_s * 0.75


async def test_a_malformed_deadline_is_a_400_naming_the_header(serve: ServeFactory) -> None:
    served = await serve()
    status, body, _ = await post(served, {**LONG, "max_tokens": 2}, "soon")
    assert status == 400 and body["error"]["param"] == "x-routegate-deadline-ms"
