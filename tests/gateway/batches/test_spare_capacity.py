"""Batch lines fill spare dedicated capacity only: an interactive request arriving while
a batch runs finds a free slot at once, and the backend is told which is which. On a
backend that hears the band the lines hold background slots, so even a full set of
interactive requests does not wait for them."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.batches.conftest import LOCAL_SLOTS, batch_policy, chat_lines, jsonl, submit
from tests.waiting import until

INTERACTIVE = {"model": "chat", "messages": [{"role": "user", "content": "now please"}]}


async def lines_in_flight(local: FakeOpenAI, count: int) -> None:
    """Until `count` batch lines have reached the dedicated backend (each is held there
    for its first-byte delay)."""
    await until(lambda: len(local.received) >= count)
    await asyncio.sleep(0.05)  # and no more are coming: the gate holds them back


def queue_ms(server_timing: str) -> float:
    match = re.search(r"queue;dur=([0-9.]+)", server_timing)
    assert match is not None, server_timing
    return float(match.group(1))


async def test_interactive_requests_find_free_slots_while_a_batch_runs(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.3), name="local")
    cloud = await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    created = await submit(client, jsonl(chat_lines(40)))
    await lines_in_flight(local, LOCAL_SLOTS // 2)  # what the batch may take of the slots

    async with aiohttp.ClientSession() as session:
        async def one() -> tuple[int, str]:
            async with session.post(gateway.base_url + "/chat/completions",
                                    json=INTERACTIVE) as response:
                await response.read()
                return response.status, response.headers["Server-Timing"]
        answers = await asyncio.gather(*(one() for _ in range(LOCAL_SLOTS // 2)))
        async with session.get(gateway.url + "/dashboard/data") as dashboard:
            running = (await dashboard.json())["batches"]

    assert [status for status, _ in answers] == [200] * (LOCAL_SLOTS // 2)
    assert all(queue_ms(timing) < 50 for _, timing in answers)  # no wait behind the batch
    interactive = [r for r in local.received if r.json["messages"][0]["content"] == "now please"]
    assert len(interactive) == LOCAL_SLOTS // 2 and not cloud.received
    assert {r.headers["x-routegate-priority"] for r in interactive} == {"1"}  # normal band
    # the dashboard shows the batch running here, its lines so far all on dedicated capacity
    assert running[created.id]["status"] == "in_progress"
    assert running[created.id]["shared_lines"] == 0 and running[created.id]["total"] == 40
    await client.batches.cancel(created.id)


@pytest.mark.parametrize("background", [True, False])
async def test_a_full_set_of_interactive_requests_runs_beside_the_batchs_background_slots(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
        background: bool) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.3), name="local")
    cloud = await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path,
                                               background_slots=background))
    client = gateway.openai()
    created = await submit(client, jsonl(chat_lines(40)))
    await lines_in_flight(local, LOCAL_SLOTS // 2)  # what the batch may take of the slots

    async with aiohttp.ClientSession() as session:
        async def one() -> float:
            async with session.post(gateway.base_url + "/chat/completions",
                                    json=INTERACTIVE) as response:
                await response.read()
                assert response.status == 200
                return queue_ms(response.headers["Server-Timing"])
        waited_ms = await asyncio.gather(*(one() for _ in range(LOCAL_SLOTS)))

    if background:  # every interactive slot was free: the lines hold background ones
        assert max(waited_ms) < 50
    else:  # the lines hold half of max_concurrency: half the requests waited for them
        assert sum(ms >= 100 for ms in waited_ms) >= LOCAL_SLOTS // 2
    await client.batches.cancel(created.id)
