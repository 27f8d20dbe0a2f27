"""Files may have a lifetime (OpenAI's `expires_after`, and a batch's
`output_expires_after` for the files it writes): past it a file is not found, not
listed, and the sweep every replica runs deletes its record and its bytes."""

from __future__ import annotations

import io
import time
from pathlib import Path

import openai
import pytest

from gateway.batches.files import FileStore
from gateway.batches.model import FileObject
from gateway.batches.state import SqliteState
from gateway.core.errors import NotFound
from tests.conftest import StartGateway, StartUpstream
from tests.gateway.batches.conftest import batch_policy, chat_lines, jsonl, until_final


async def test_an_upload_and_a_batchs_output_carry_the_lifetime_asked_for(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    file = await client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl(chat_lines(2)))), purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600})
    assert file.expires_at == file.created_at + 3600
    assert (await client.files.retrieve(file.id)).expires_at == file.expires_at

    created = await client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200})
    batch = await until_final(client, created.id)
    assert batch.output_file_id is not None
    output = await client.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + 7200

    kept = await client.files.create(file=("k.jsonl", io.BytesIO(jsonl(chat_lines(1)))),
                                     purpose="batch")
    assert kept.expires_at is None  # no lifetime asked for: kept until deleted


@pytest.mark.parametrize("expires_after", [
    {"anchor": "created_at", "seconds": 60},  # under an hour
    {"anchor": "created_at", "seconds": 31 * 24 * 3600},  # over 30 days
    {"anchor": "last_active_at", "seconds": 3600},
])
async def test_a_lifetime_out_of_bounds_is_refused_naming_the_field(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path,
        expires_after: dict[str, object]) -> None:
    local, cloud = await start_upstream(name="local"), await start_upstream(name="cloud")
    gateway = await start_gateway(batch_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()
    with pytest.raises(openai.BadRequestError) as bad:
        await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(chat_lines(1)))),
                                  purpose="batch", expires_after=expires_after)  # type: ignore[arg-type]
    assert bad.value.param == "expires_after"
    assert not [f async for f in client.files.list()]  # nothing kept
    file = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(chat_lines(1)))),
                                     purpose="batch")
    with pytest.raises(openai.BadRequestError) as bad:
        await client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                    completion_window="24h",
                                    output_expires_after=expires_after)  # type: ignore[arg-type]
    assert bad.value.param == "output_expires_after"


async def test_the_sweep_deletes_an_expired_files_record_and_bytes(tmp_path: Path) -> None:
    state = SqliteState(tmp_path / "batches.sqlite3")
    files = FileStore(tmp_path, state)
    try:
        short = await files.keep("acme", "a.jsonl", "batch", b"{}\n", 1, expires_s=3600)
        kept = await files.keep("acme", "b.jsonl", "batch", b"{}\n", 1)
        assert await files.sweep(time.time()) == 0  # not yet
        assert await files.sweep(time.time() + 3601) == 1
        assert await state.get_file(short.id) is None
        assert not files.path(short.id).exists()
        assert (await files.get("acme", kept.id)) == kept and files.path(kept.id).exists()
    finally:
        await state.aclose()


async def test_an_expired_file_not_yet_swept_is_not_found(tmp_path: Path) -> None:
    state = SqliteState(tmp_path / "batches.sqlite3")
    files = FileStore(tmp_path, state)
    try:
        await state.put_file(FileObject(id="file_old", bytes=1, created_at=1, filename="f",
                                        purpose="batch", tenant="acme", expires_at=3601))
        with pytest.raises(NotFound):
            await files.get("acme", "file_old")
    finally:
        await state.aclose()
