"""The Files and Batches API through the official `openai` SDK, against the real gateway
over fake backends."""

from __future__ import annotations

import io
from pathlib import Path

import aiohttp
import openai
import pytest

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


async def test_a_batch_answers_every_line_once_in_the_output_file(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    created = await submit(client, jsonl(chat_lines(12)))
    assert created.status == "validating"
    assert created.request_counts is not None and created.request_counts.total == 12

    batch = await until_final(client, created.id)

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (12, 0)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    out = await file_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{n}" for n in range(12))
    assert all(line["response"]["status_code"] == 200 and line["error"] is None
               for line in out)
    assert out[0]["response"]["body"]["object"] == "chat.completion"
    assert batch.error_file_id is None


async def test_batch_lines_run_on_idle_dedicated_capacity_at_the_lowest_band(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    batch = await until_final(client, (await submit(client, jsonl(chat_lines(6)))).id)

    report = batch.model_extra["routegate"] if batch.model_extra else {}
    assert report["dedicated"]["lines"] == 6 and report["shared"]["lines"] == 0
    assert len(local.received) == 6 and not cloud.received
    assert {r.headers.get("x-routegate-priority") for r in local.received} == {"3"}  # batch
    # one key per line, the same whichever replica sends it (docs/batches.md)
    assert sorted(r.headers["Idempotency-Key"] for r in local.received) == sorted(
        f"{batch.id}/{n}" for n in range(6))
    # the saving: what the same tokens would have cost on the cheapest shared target
    assert report["all_shared_cost_micros"] > 0
    assert report["saving_micros"] == report["all_shared_cost_micros"] - report["cost_micros"]
    async with aiohttp.ClientSession() as session, session.get(gateway.url + "/metrics") as got:
        metrics = await got.text()
    assert 'routegate_batch_lines_total{outcome="ok",placement="dedicated"} 6.0' in metrics
    assert 'routegate_batches_finished_total{status="completed"} 1.0' in metrics


async def test_malformed_lines_become_error_records_and_the_rest_still_run(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    good = chat_lines(3)
    lines = [good[0], b"{not json", {"method": "POST", "url": "/v1/chat/completions",
                                     "body": {}}, good[1],
             {**good[2], "custom_id": "line-0"},  # a repeated custom_id
             {"custom_id": "wrong-url", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "chat", "input": "x"}},
             {"custom_id": "no-model", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "hi"}]}},
             {"custom_id": "odd-model", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": ["chat"], "messages": [{"role": "user", "content": "hi"}]}}]

    batch = await until_final(client, (await submit(client, jsonl(lines))).id)

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed,
            batch.request_counts.failed) == (8, 2, 6)
    errors = await file_lines(client, batch.error_file_id)
    codes = [line["error"]["code"] for line in errors]
    assert codes[:4] == ["invalid_json", "missing_custom_id", "duplicate_custom_id",
                         "invalid_url"]
    assert [line["custom_id"] for line in errors[4:]] == ["no-model", "odd-model"]
    # refused by the pipeline itself, as the same request sent interactively would be
    assert {line["response"]["status_code"] for line in errors[4:]} == {400}
    assert [line["custom_id"] for line in await file_lines(client, batch.output_file_id)] \
        == ["line-0", "line-1"]


async def test_an_upload_past_the_line_limit_is_refused_naming_the_line(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path, max_lines=3,
                                               max_line_bytes=400))
    client = gateway.openai()
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(chat_lines(4)))),
                                  purpose="batch")
    assert "Line 4" in too_many.value.message and "batches.max_lines" in too_many.value.message
    long_line = {**chat_lines(1)[0], "custom_id": "x" * 500}
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.files.create(
            file=("in.jsonl", io.BytesIO(jsonl([*chat_lines(1), long_line]))), purpose="batch")
    assert "Line 2" in too_long.value.message


async def test_cancel_mid_run_stops_sending_and_keeps_what_finished(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.1), name="local")
    cloud = await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    created = await submit(client, jsonl(chat_lines(200)))
    await local.request_seen.wait()

    cancelling = await client.batches.cancel(created.id)
    batch = await until_final(client, created.id)

    assert cancelling.status in ("cancelling", "cancelled")
    assert batch.status == "cancelled" and batch.cancelled_at
    assert batch.request_counts is not None
    done = batch.request_counts.completed
    assert 0 < done < 200 and len(local.received) == done  # no line sent after the cancel
    assert len(await file_lines(client, batch.output_file_id)) == done


async def test_files_and_batches_are_the_tenants_own_and_listed_newest_first(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    ids = [(await submit(client, jsonl(chat_lines(1)))).id for _ in range(3)]
    page = await client.batches.list(limit=2)
    assert [batch.id for batch in page.data] == ids[::-1][:2] and page.has_more
    rest = await client.batches.list(limit=2, after=page.data[-1].id)
    assert [batch.id for batch in rest.data] == ids[:1]
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_unknown")
    with pytest.raises(openai.BadRequestError) as bad:
        await client.batches.create(input_file_id="file_x", endpoint="/v1/completions",
                                    completion_window="24h")
    assert bad.value.param == "endpoint"


async def test_a_batch_whose_file_bytes_are_missing_fails_and_says_where_to_look(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(chat_lines(2)))),
                                     purpose="batch")
    (tmp_path / "files" / f"{file.id}.jsonl").unlink()  # a replica without the volume

    created = await client.batches.create(input_file_id=file.id,
                                          endpoint="/v1/chat/completions",
                                          completion_window="24h")
    batch = await until_final(client, created.id)

    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "input_file_missing"
    assert "shared volume" in (batch.errors.data[0].message or "")
    assert not local.received


async def test_files_are_listed_a_page_at_a_time_newest_first_or_oldest_first(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    ids = [(await client.files.create(file=(f"in-{n}.jsonl", io.BytesIO(jsonl(chat_lines(1)))),
                                      purpose="batch")).id for n in range(3)]
    batch = await until_final(client, (await client.batches.create(
        input_file_id=ids[0], endpoint="/v1/chat/completions", completion_window="24h")).id)

    page = await client.files.list(limit=2)
    assert [f.id for f in page.data] == [batch.output_file_id, ids[2]] and page.has_more
    every = [f.id async for f in client.files.list(limit=2)]  # the SDK follows the cursor
    assert every == [batch.output_file_id, *ids[::-1]]
    inputs = [f.id async for f in client.files.list(purpose="batch", order="asc", limit=1)]
    assert inputs == ids
    await client.files.delete(ids[1])
    assert [f.id async for f in client.files.list(purpose="batch")] == [ids[2], ids[0]]
    with pytest.raises(openai.BadRequestError) as bad:
        await client.files.list(order="sideways")  # type: ignore[arg-type]
    assert bad.value.param == "order"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.files.list(limit=0)
    assert bad.value.param == "limit"
