"""A draining gateway sends no more batch lines, lets those in flight finish and hands
the batch over; a gateway on the same data directory (the embedded SQLite store)
resumes it, running only the lines without a result."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from gateway.core.drain import DRAIN
from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.batches.conftest import (
    batch_policy,
    chat_lines,
    file_lines,
    jsonl,
    submit,
    until_final,
)

LINES = 40


async def test_a_draining_gateway_hands_its_batch_to_the_next_one_on_the_same_data(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.05), name="local")
    cloud = await start_upstream(name="cloud")
    policy = batch_policy(local.url, cloud.url, tmp_path)
    first = await start_gateway(policy)
    created = await submit(first.openai(), jsonl(chat_lines(LINES)))
    async with asyncio.timeout(5):
        while True:  # the fake records requests; polled
            if len(local.received) >= LINES // 4:
                break
            await asyncio.sleep(0.01)

    first.app[DRAIN].begin()
    await asyncio.sleep(0.5)  # what was in flight finishes; nothing new is sent
    sent_by_first = len(local.received)
    await asyncio.sleep(0.3)
    paused = await first.openai().batches.retrieve(created.id)

    assert len(local.received) == sent_by_first < LINES
    assert paused.status == "in_progress"
    assert paused.request_counts is not None and paused.request_counts.completed == sent_by_first

    second = await start_gateway(policy)
    batch = await until_final(second.openai(), created.id)

    assert batch.status == "completed"
    out = await file_lines(second.openai(), batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{n}" for n in range(LINES))
    sent = Counter(r.json["messages"][0]["content"] for r in local.received)
    assert len(sent) == LINES and set(sent.values()) == {1}  # each line ran exactly once
