"""A batch may target `/v1/embeddings` and `/v1/responses` as well as chat completions,
each line answered in that endpoint's shape; lines run as the key that created the batch,
and a tenant sees only its own files and batches."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import openai
import pytest

from tests.conftest import StartGateway, StartUpstream
from tests.gateway.batches.conftest import batch_policy, file_lines, jsonl, until_final

KEY, OTHER = "sk-batch-tenant", "sk-other-tenant"


def key_hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


async def test_embeddings_and_responses_batches_answer_in_their_own_shape(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    inputs = {
        "/v1/embeddings": {"model": "chat", "input": "a sentence"},
        "/v1/responses": {"model": "chat", "input": "say hi"},
    }
    for endpoint, body in inputs.items():
        data = jsonl([{"custom_id": "only", "method": "POST", "url": endpoint, "body": body}])
        file = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        created = await client.batches.create(
            input_file_id=file.id, endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h")
        batch = await until_final(client, created.id)
        [line] = await file_lines(client, batch.output_file_id)
        expected = "list" if endpoint == "/v1/embeddings" else "response"
        assert line["response"]["body"]["object"] == expected


async def test_lines_run_as_the_key_that_created_the_batch(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    policy = batch_policy(local.url, cloud.url, tmp_path)
    policy["auth"] = {"anonymous": {"enabled": False}}
    policy["tenants"] = {"acme": {"api_keys": [key_hash(KEY)]},
                         "globex": {"api_keys": [key_hash(OTHER)]}}
    gateway = await start_gateway(policy)
    client = gateway.openai(api_key=KEY)
    data = jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "chat", "messages": [{"role": "user", "content": "x"}]}}])
    file = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    created = await client.batches.create(input_file_id=file.id,
                                          endpoint="/v1/chat/completions",
                                          completion_window="24h")
    batch = await until_final(client, created.id)
    assert batch.request_counts is not None and batch.request_counts.completed == 1
    assert (await client.batches.list()).data[0].id == created.id
    other = gateway.openai(api_key=OTHER)
    with pytest.raises(openai.NotFoundError):  # another tenant's batch is not found
        await other.batches.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.content(file.id)
    assert (await other.batches.list()).data == []
