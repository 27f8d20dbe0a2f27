"""The priority band over HTTP: header or body field into the engine, its metrics by band,
and a request that cannot meet its deadline refused (504) before its prefill."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.local_backend.server.conftest import Served, ServeFactory
from tests.local_backend.server.test_deadline import LONG, holding_the_only_slot, release


async def post(served: Served, body: dict[str, Any], headers: dict[str, str],
               ) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            served.url + "/completions", json=body, headers=headers) as response:
        return response.status, await response.json()


async def metrics(served: Served) -> str:
    async with aiohttp.ClientSession() as session, session.get(
            str(served.server.make_url("/metrics"))) as response:
        return await response.text()


async def waiting_bands(served: Served, count: int) -> dict[int, int]:
    for _ in range(1000):
        bands = {b.band: b.waiting for b in served.engine.stats().bands if b.waiting}
        if sum(bands.values()) >= count:
            return bands
        await asyncio.sleep(0.005)
    raise AssertionError("the requests never queued")


async def test_the_band_comes_from_the_header_or_else_the_body(serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=1, num_blocks=512)
    holder = await holding_the_only_slot(served)
    short = {**LONG, "max_tokens": 2}
    queued = [asyncio.create_task(post(served, {**short, "priority": 5}, {})),
              asyncio.create_task(post(served, {**short, "priority": 5},
                                       {"x-routegate-priority": "3"})),
              asyncio.create_task(post(served, short, {}))]

    assert await waiting_bands(served, 3) == {5: 1, 3: 1, 1: 1}  # no band given: 1
    text = await metrics(served)
    assert 'routegate:num_requests_waiting_by_band{band="3",model_name="tiny"} 1.0' in text
    await release(holder)
    assert [status for status, _ in await asyncio.gather(*queued)] == [200, 200, 200]
    text = await metrics(served)
    assert 'routegate:request_queue_time_seconds_by_band_count{band="5",model_name="tiny"} 1.0' \
        in text
    assert "routegate:num_preemptions_by_band_total" in text


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"priority": -1}, {}, "priority"),
    ({"priority": 10}, {}, "priority"),
    ({"priority": "high"}, {}, "priority"),
    ({"priority": 1.5}, {}, "priority"),
    ({}, {"x-routegate-priority": "high"}, "x-routegate-priority"),
    ({}, {"x-routegate-priority": "-2"}, "x-routegate-priority"),
])
async def test_a_band_out_of_range_is_a_400_naming_where_it_came_from(
        serve: ServeFactory, body: dict[str, Any], headers: dict[str, str], param: str) -> None:
    served = await serve()
    status, answer = await post(served, {**LONG, "max_tokens": 2, **body}, headers)
    assert status == 400 and answer["error"]["param"] == param


async def test_a_request_that_cannot_finish_by_its_deadline_gets_504_before_prefill(
        serve: ServeFactory) -> None:
    served = await serve(num_blocks=512)
    # One finished request teaches the engine its pace: steps, and a usual length.
    status, _ = await post(served, {**LONG, "max_tokens": 300}, {})
    assert status == 200
    pace = served.engine.scheduler.pace
    assert pace.step_s is not None and pace.completion_tokens == 300
    hopeless_ms = pace.step_s * 1000 * 100  # a third of the steps 300 tokens take

    status, answer = await post(served, {**LONG, "max_tokens": 300},
                                {"x-routegate-deadline-ms": f"{hopeless_ms:.1f}"})

    assert status == 504 and answer["error"]["code"] == "deadline_exceeded"
    doomed = {b.band: b.doomed for b in served.engine.stats().bands}
    assert doomed == {1: 1}
    assert served.engine.stats().prefix_cache_queries == 3  # only the first was prefilled


async def test_a_full_queue_sheds_a_low_band_request_for_a_high_one_with_429(
        serve: ServeFactory) -> None:
    served = await serve(max_num_seqs=1, max_waiting=2, num_blocks=512)
    holder = await holding_the_only_slot(served)
    short = {**LONG, "max_tokens": 2}
    lows = [asyncio.create_task(post(served, short, {"x-routegate-priority": "2"}))
            for _ in range(2)]
    await waiting_bands(served, 2)
    status, answer = await post(served, short, {"x-routegate-priority": "2"})
    assert status == 429 and answer["error"]["code"] == "queue_full"  # no worse one to shed
    high = asyncio.create_task(post(served, short, {"x-routegate-priority": "0"}))
    for _ in range(1000):
        if sum(task.done() for task in lows) == 1:
            break
        await asyncio.sleep(0.005)
    shed = [task.result() for task in lows if task.done()]
    assert len(shed) == 1 and shed[0][0] == 429 and shed[0][1]["error"]["code"] == "queue_full"
    await release(holder)
    assert (await high)[0] == 200
    assert [status for status, _ in await asyncio.gather(*lows)].count(200) == 1
