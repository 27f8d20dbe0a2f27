"""A gateway with one dedicated backend and one shared backend (both fakes speaking
OpenAI's wire format), batch state in a temporary data directory."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import openai
import orjson
from openai.types import Batch

# the dedicated backend's slots: with spare_queue_use 0.5, batch lines use at most 2
LOCAL_SLOTS = 4


def batch_policy(local_url: str, cloud_url: str, data_dir: Path, **batches: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "backends": {
            "local": {"type": "openai", "url": local_url, "deployment": "dedicated",
                      "gpu_hour_usd": 2.0, "max_concurrency": LOCAL_SLOTS,
                      "models": {"llama": {}}},
            "cloud": {"type": "openai", "url": cloud_url, "deployment": "shared",
                      "models": {"gpt-4o-mini": {"input_usd_per_mtok": 0.15,
                                                 "output_usd_per_mtok": 0.60},
                                 "gpt-4o-mini-batch": {"input_usd_per_mtok": 0.075,
                                                       "output_usd_per_mtok": 0.30}}},
        },
        "routes": {"chat": {"targets": ["local/llama", "cloud/gpt-4o-mini"],
                            "objective": "ordered"}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
        "defaults": {"limits": {"requests_per_minute": 100_000,
                                "tokens_per_minute": 10_000_000}},
        "batches": {"data_dir": str(data_dir), "poll_interval_s": 0.1, **batches},
    }


def chat_lines(count: int, *, model: str = "chat") -> list[dict[str, Any]]:
    return [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "messages": [{"role": "user", "content": f"hello {n}"}]}}
            for n in range(count)]


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n"
                    for line in lines)


async def submit(client: openai.AsyncOpenAI, data: bytes, *, window: str = "24h") -> Batch:
    file = await client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    return await client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                       completion_window=window)  # type: ignore[arg-type]


async def until_final(client: openai.AsyncOpenAI, batch_id: str, *,
                      within_s: float = 8.0) -> Batch:
    async with asyncio.timeout(within_s):
        while True:
            batch = await client.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                return batch
            await asyncio.sleep(0.05)


async def file_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(line) for line in content.content.splitlines() if line]
