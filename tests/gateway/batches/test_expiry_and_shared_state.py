"""A batch with nowhere to spill that its backend cannot finish in time expires, every
unsent line an error record; with batch state in Redis any replica answers for a batch
and a cancel sent to one stops the run on another."""

from __future__ import annotations

from pathlib import Path

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
from tests.redis_server import RedisServer


async def test_a_batch_with_nowhere_to_spill_expires_and_no_line_is_lost(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.8), name="local")
    cloud = await start_upstream(name="cloud")
    policy = batch_policy(local.url, cloud.url, tmp_path, spill_margin_s=1.0)
    policy["routes"] = {"chat": {"targets": ["local/llama"]}}  # dedicated only
    gateway = await start_gateway(policy)
    client = gateway.openai()

    batch = await until_final(client, (await submit(client, jsonl(chat_lines(30)),
                                                    window="2s")).id)

    assert batch.status == "expired" and batch.expired_at
    assert batch.request_counts is not None
    counts = batch.request_counts
    assert counts.total == 30 and counts.completed + counts.failed == 30
    assert 0 < counts.completed < 30
    errors = await file_lines(client, batch.error_file_id)
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    assert len(errors) == counts.failed and not cloud.received


async def test_any_replica_answers_for_a_batch_and_a_cancel_reaches_the_one_running_it(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
        redis_server: RedisServer) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.1), name="local")
    cloud = await start_upstream(name="cloud")
    policy = batch_policy(local.url, cloud.url, tmp_path, store=redis_server.url)
    first, second = await start_gateway(policy), await start_gateway(policy)
    created = await submit(first.openai(), jsonl(chat_lines(100)))
    await local.request_seen.wait()

    seen = await second.openai().batches.retrieve(created.id)
    await second.openai().batches.cancel(created.id)
    batch = await until_final(first.openai(), created.id)

    assert seen.id == created.id and seen.status in ("validating", "in_progress")
    assert batch.status == "cancelled"
    assert batch.request_counts is not None and batch.request_counts.completed < 100
    listed = await second.openai().batches.list()
    assert [b.id for b in listed.data] == [created.id]
