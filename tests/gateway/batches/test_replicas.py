"""Batch state shared through a real Redis by two `routegate serve` processes: either
answers for a batch, one runs it, and when that one is killed (SIGKILL, no goodbye) the
other takes the lease over and finishes the batch without re-running a finished line
and without losing one."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import yaml

from gateway.batches.redis_state import RedisState
from tests.conftest import StartUpstream
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.batches.conftest import batch_policy, chat_lines, file_lines, jsonl, submit
from tests.ports import free_port
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
LINES = 60

@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    yield started
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def start_replica(policy_path: Path, log: Path) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROUTEGATE_", "OTEL_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path), "--port",
        str(port), cwd=ROOT, env=env, stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="anonymous", max_retries=0)
    async with asyncio.timeout(30):
        while True:
            if process.returncode is not None:
                raise RuntimeError(await asyncio.to_thread(log.read_text))
            try:
                await client.models.list()
                return process, url
            except openai.APIConnectionError:
                await asyncio.sleep(0.1)


async def test_a_replica_killed_mid_batch_is_taken_over_and_no_finished_line_runs_twice(
        start_upstream: StartUpstream, redis_server: RedisServer, tmp_path: Path,
        replicas: list[asyncio.subprocess.Process]) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.05), name="local")
    cloud = await start_upstream(name="cloud")
    policy = batch_policy(local.url, cloud.url, tmp_path / "shared-volume",
                          store=redis_server.url, lease_s=1.0)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    first, first_url = await start_replica(path, tmp_path / "first.log")
    replicas.append(first)
    second, second_url = await start_replica(path, tmp_path / "second.log")
    replicas.append(second)
    to_first = openai.AsyncOpenAI(base_url=first_url + "/v1", api_key="anonymous")
    to_second = openai.AsyncOpenAI(base_url=second_url + "/v1", api_key="anonymous")
    created = await submit(to_first, jsonl(chat_lines(LINES)))
    state = RedisState(redis_server.url)
    try:
        async with asyncio.timeout(10):  # a third of the lines done, by whichever runs it
            while True:  # polled: the results live in another process's Redis writes
                if len(await state.results(created.id)) >= LINES // 3:
                    break
                await asyncio.sleep(0.02)
        holder = await state.holder(created.id)
        assert holder is not None
        runner, other = (first, second) if f":{first.pid}:" in holder else (second, first)
        finished_before = {result.custom_id for result in
                           (await state.results(created.id)).values()}
        runner.send_signal(signal.SIGKILL)
        await runner.wait()
        survivor = to_second if runner is first else to_first

        holders = set()
        async with asyncio.timeout(15):
            while (batch := await survivor.batches.retrieve(created.id)).status != "completed":
                holders.add(await state.holder(created.id))
                await asyncio.sleep(0.05)
    finally:
        await state.aclose()

    assert any(f":{other.pid}:" in (h or "") for h in holders)  # the survivor took it over
    assert batch.request_counts is not None and batch.request_counts.completed == LINES
    out = await file_lines(survivor, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{n}" for n in range(LINES))
    sent = Counter(r.json["messages"][0]["content"].removeprefix("hello ")
                   for r in [*local.received, *cloud.received])
    assert set(sent) == {str(n) for n in range(LINES)}  # none lost
    twice = {f"line-{n}" for n, times in sent.items() if times > 1}
    assert not twice & finished_before  # a line with a stored result never runs again
    assert len(twice) <= 8  # at most the lines in flight at the kill (`lines_in_flight`)
